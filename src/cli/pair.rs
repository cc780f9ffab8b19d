//! `bramble pair [--channel telegram|matrix|email|discord|signal|feishu]`: a one-time code for a
//! new user of a channel with users; `--list`, `--revoke ID`. Without
//! `--channel` it is Telegram, as it always was. The codes and lists are
//! [`crate::policy::pairing`]'s; this is only the terminal's side.

use std::process::ExitCode;

use crate::bus::Principal;
use crate::policy::pairing::{self, PairChannel};

/// `bramble pair`.
pub async fn pair(
    loaded: &crate::config::Loaded,
    channel: Option<super::args::PairWith>,
    list: bool,
    revoke: Option<String>,
) -> anyhow::Result<ExitCode> {
    use super::args::PairWith;
    let channel = match channel {
        None | Some(PairWith::Telegram) => PairChannel::Telegram,
        Some(PairWith::Matrix) => PairChannel::Matrix,
        Some(PairWith::Email) => PairChannel::Email,
        Some(PairWith::Discord) => PairChannel::Discord,
        Some(PairWith::Signal) => PairChannel::Signal,
        Some(PairWith::Feishu) => PairChannel::Feishu,
    };
    let state = &loaded.paths.state_dir;
    if list {
        let users = pairing::paired(state, channel);
        if users.is_empty() {
            println!("no paired {channel} users ([{channel}] allow_from in the config still applies)");
        }
        for u in users {
            let name = match (u.username, u.number) {
                (_, Some(number)) => format!(" ({})", crate::util::text::escape_line(&number)),
                (Some(n), None) => format!(" (@{})", crate::util::text::escape_line(&n)),
                (None, None) => String::new(),
            };
            let id = u.id.to_string();
            println!(
                "{}{name}, paired {}",
                crate::util::text::escape_line(&id),
                u.paired.strftime("%Y-%m-%d %H:%M UTC")
            );
        }
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(id) = revoke {
        let who = match pairing::signal_by_number(state, &id).filter(|_| channel == PairChannel::Signal) {
            Some(who) => who,
            None => channel.principal(&id)?,
        };
        crate::util::fs::create_private_dir(state)?;
        if pairing::revoke(state, &who)? {
            println!("revoked {id}: the running daemon stops serving them at their next message");
            revoke_jobs(loaded, &who).await?;
            return Ok(ExitCode::SUCCESS);
        }
        let flag = if channel == PairChannel::Telegram { String::new() } else { format!(" --channel {channel}") };
        eprintln!(
            "bramble: {id} is not a paired user of {channel} (`bramble pair{flag} --list`; ids in allow_from are the config's)"
        );
        return Ok(ExitCode::FAILURE);
    }
    let how = match channel {
        PairChannel::Telegram => telegram_ready(loaded).await?,
        PairChannel::Matrix => matrix_ready(&loaded.config)?,
        PairChannel::Email => email_ready(&loaded.config)?,
        PairChannel::Discord => discord_ready(&loaded.config)?,
        PairChannel::Signal => signal_ready(&loaded.config)?,
        PairChannel::Feishu => feishu_ready(&loaded.config)?,
    };
    crate::util::fs::create_private_dir(state)?;
    let (code, expires) = pairing::new_code(state, channel, jiff::Timestamp::now())?;
    let local = expires.to_zoned(loaded.config.timezone().tz().clone());
    println!("{how}, before {}:", local.strftime("%H:%M"));
    println!();
    println!("    /pair {code}");
    println!();
    let flag = if channel == PairChannel::Telegram { String::new() } else { format!(" --channel {channel}") };
    println!(
        "The code works once; a new `bramble pair{flag}` replaces it. `bramble pair{flag} --list` shows who is paired."
    );
    Ok(ExitCode::SUCCESS)
}

/// Telegram is configured (the running daemon's word first: its environment
/// may hold the token this shell lacks); what the new user does.
async fn telegram_ready(loaded: &crate::config::Loaded) -> anyhow::Result<String> {
    match super::status::daemon_facts(loaded).await {
        Some(f) if f.telegram_token => println!("(Telegram is configured in the running daemon, pid {})", f.pid),
        Some(_) => anyhow::bail!(
            "Telegram is not configured in the running daemon ([telegram] token_env; from the running daemon): \
             there is no bot to pair with"
        ),
        None if loaded.config.telegram.token().is_none() => anyhow::bail!(
            "Telegram is not configured ([telegram] token_env; read in this shell, no daemon answered): there is \
             no bot to pair with"
        ),
        None => {}
    }
    Ok("Send this to the bot from the new user's Telegram".into())
}

fn matrix_ready(config: &crate::config::Config) -> anyhow::Result<String> {
    if config.matrix.homeserver.is_none() {
        anyhow::bail!("Matrix is not configured ([matrix] homeserver): there is no bot to pair with");
    }
    let bot = config.matrix.user_id.as_deref().unwrap_or("the bot");
    Ok(format!(
        "From the new user's Matrix account, invite {bot} to an unencrypted room (or use a room the bot is \
         in) and send this there"
    ))
}

fn email_ready(config: &crate::config::Config) -> anyhow::Result<String> {
    let email = &config.email;
    let (Some(address), true) = (email.address.as_ref(), email.enabled() && email.imap.is_some()) else {
        anyhow::bail!("email is not configured ([email] address and imap): there is no mailbox to pair with");
    };
    Ok(format!("Have the new user mail {} from their address, with this as the subject (or the first line)", address.0))
}

fn discord_ready(config: &crate::config::Config) -> anyhow::Result<String> {
    if !cfg!(feature = "discord") {
        anyhow::bail!("this build has no Discord (cargo feature `discord`): there is no bot to pair with");
    }
    if config.discord.token_env.is_none() {
        anyhow::bail!("Discord is not configured ([discord] token_env): there is no bot to pair with");
    }
    Ok("From the new user's Discord account, send this to the bot in a direct message (not in a server channel)".into())
}

fn signal_ready(config: &crate::config::Config) -> anyhow::Result<String> {
    if !cfg!(feature = "signal") {
        anyhow::bail!("this build has no Signal (cargo feature `signal`): there is no account to pair with");
    }
    if config.signal.endpoint.is_none() {
        anyhow::bail!("Signal is not configured ([signal] endpoint): there is no account to pair with");
    }
    let to = config.signal.account.as_deref().unwrap_or("the bot's Signal account");
    Ok(format!("From the new user's Signal, send this to {to} in a direct message (not in a group)"))
}

fn feishu_ready(config: &crate::config::Config) -> anyhow::Result<String> {
    if !cfg!(feature = "feishu") {
        anyhow::bail!("this build has no Feishu / Lark (cargo feature `feishu`): there is no bot to pair with");
    }
    if config.feishu.app_id.is_none() {
        anyhow::bail!("Feishu / Lark is not configured ([feishu] app_id): there is no bot to pair with");
    }
    Ok("From the new user's Feishu / Lark, send this to the bot in a one-to-one chat (not in a group)".into())
}

/// Whether `who` is still in their channel's `allow_from` (then their jobs keep running).
fn still_allowed(loaded: &crate::config::Loaded, who: &Principal) -> bool {
    let c = &loaded.config;
    match who {
        Principal::Telegram(id) => crate::daemon::assemble::standing(loaded).telegram_allows(*id),
        Principal::Matrix(user) => c.matrix.allow_from.iter().any(|u| u.trim() == user),
        Principal::Email(addr) => c.email.allow_from.iter().any(|a| a.0.eq_ignore_ascii_case(addr)),
        Principal::Discord(id) => c.discord.users().contains(id),
        Principal::Feishu(open_id) => c.feishu.allow_from.iter().any(|u| u.trim() == open_id),
        // A uuid listed, or pinned to a listed number (the paired list no longer has them).
        Principal::Signal(id) => {
            crate::policy::signal::SignalPolicy::new(&c.signal.allow_from, &[], &loaded.paths.state_dir).allows(id)
        }
        _ => false,
    }
}

/// After `pair --revoke id`: disable the jobs the user made (unless the
/// config's `allow_from` still lists them), say which, and record it in the
/// audit trail. The scheduler refuses them anyway ([`crate::policy::Standing`]);
/// this makes it visible at once, in `cron list` too.
async fn revoke_jobs(loaded: &crate::config::Loaded, who: &Principal) -> anyhow::Result<()> {
    let store = crate::scheduler::JobStore::open(&loaded.paths.state_dir);
    let channel = PairChannel::of(who).map(|(c, _)| c.name()).unwrap_or("its");
    if still_allowed(loaded, who) {
        println!("  {who} is still in [{channel}] allow_from: their jobs keep running (remove them there too)");
        return Ok(());
    }
    let names = store.update(|jobs| {
        let mut names = Vec::new();
        for job in jobs.iter_mut().filter(|j| j.enabled && !j.state.done && &j.made_by() == who) {
            job.enabled = false;
            names.push(format!("{} ({})", job.name, job.id));
        }
        Ok(names)
    })?;
    if names.is_empty() {
        println!("  they made no job that is still enabled");
        return Ok(());
    }
    println!(
        "  disabled {} job{} they made: {}",
        names.len(),
        if names.len() == 1 { "" } else { "s" },
        names.join(", ")
    );
    // The audit file: `bramble audit` reads it beside the service's journal.
    let audit = crate::tools::audit::Audit::new(&loaded.paths.state_dir, false);
    let id = match who {
        Principal::Telegram(id) => id.to_string(),
        other => other.to_string(),
    };
    let detail = format!("pair --revoke {id}: disabled {}", names.join(", "));
    audit.record_cli(&super::invoking_user(), &detail, true).await;
    Ok(())
}
