//! How the configured agent is put together from a loaded config: provider,
//! tools (with what each needs), skills, context and sub-agents.

use super::*;

impl Agent {
    /// The agent as the configuration describes it: provider, tools, sessions, context.
    ///
    /// Messages sent by the `message` tool go to `outbound`; `mqtt_publish`
    /// publishes through `mqtt` (the daemon's connection; `None` elsewhere).
    pub fn from_config(
        loaded: &crate::config::Loaded,
        outbound: mpsc::Sender<OutboundMessage>,
        mqtt: Option<Arc<dyn crate::delivery::Publisher>>,
    ) -> Agent {
        let c = &loaded.config;
        let ws = loaded.paths.workspace.clone();
        let provider = crate::provider::from_config(&c.provider).map_err(|e| e.to_string());
        if let Err(why) = &provider {
            tracing::warn!("LLM turns will fail: {why}");
        }
        let mut tools = ToolRegistry::new(c.agent.max_tool_result_chars);
        for tool in crate::tools::fs::fs_tools(&ws) {
            tools.register(tool);
        }
        if c.exec.enabled {
            crate::sandbox::protect(crate::sandbox::private_paths(loaded));
            tools.register(Arc::new(crate::tools::exec::ExecTool::new(c.exec.clone(), ws.clone())));
        }
        if c.web.enabled {
            match crate::tools::web::WebFetch::new(&c.web) {
                Ok(web) => tools.register(Arc::new(web)),
                Err(e) => tracing::warn!("web_fetch is unavailable: {e}"),
            }
        }
        let telegram_chats = crate::policy::AllowedChats::new(&c.telegram.allow_from, &loaded.paths.state_dir);
        tools.register(Arc::new(crate::tools::message::MessageTool::new(
            outbound.clone(),
            c.mqtt.publish_allow.clone(),
            telegram_chats.clone(),
        )));
        if c.mqtt.url.is_some() {
            tools.register(Arc::new(crate::tools::mqtt::MqttPublish::new(c.mqtt.publish_allow.clone(), mqtt)));
        }
        tools.register(Arc::new(crate::tools::cron::CronTool::new(
            crate::scheduler::JobStore::open(&loaded.paths.state_dir),
            c.timezone(),
            telegram_chats,
        )));
        let journal = Journal::new(&ws, c.timezone());
        tools.register(Arc::new(memory::MemorySearchTool::new(journal)));
        let (_, skill_errors) = skills::load(&ws);
        for e in &skill_errors {
            tracing::warn!("skill left out: {e}");
        }
        let context = ContextBuilder::new(
            ws,
            c.timezone(),
            context::ContextLimits {
                per_file_chars: c.agent.bootstrap_max_chars,
                total_chars: c.agent.bootstrap_total_chars,
            },
        );
        let settings = AgentSettings {
            model: c.model().to_string(),
            max_iterations: c.agent.max_iterations,
            max_tokens: c.agent.max_tokens,
            temperature: c.agent.temperature,
            history_messages: c.agent.history_messages,
            context_tokens: c.agent.context_tokens,
            daily_token_budget: c.agent.daily_token_budget,
            unanswered: c.agent.unanswered,
        };
        let inflight = InFlight::default();
        let hub = provider.as_ref().ok().map(|p| {
            let sub = subagent::SubagentSettings {
                model: settings.model.clone(),
                max_tokens: settings.max_tokens,
                temperature: settings.temperature,
                max_iterations: c.agent.subagent_max_iterations,
                max_running: c.agent.max_subagents,
            };
            let usage = UsageLedger::new(&loaded.paths.state_dir, c.timezone());
            let hub = subagent::Hub::new(
                Arc::clone(p),
                &tools,
                context.clone(),
                sub,
                outbound,
                usage,
                inflight.shutdown_token().clone(),
            );
            tools.register(Arc::new(subagent::SpawnTool::new(Arc::clone(&hub))));
            hub
        });
        let mut agent = Agent::new(provider, tools, SessionStore::new(&loaded.paths.state_dir), context, settings)
            .with_jobs(crate::scheduler::JobStore::open(&loaded.paths.state_dir), c.timezone().tz().clone())
            .with_exec(c.exec.clone());
        agent.inflight = inflight;
        agent.subagents = hub;
        agent
    }
}
