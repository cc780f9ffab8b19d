//! Serde for `jiff::Timestamp` as RFC 3339 text (`2026-11-22T08:00:00Z`).
//!
//! The job file's timestamps go through these helpers (`#[serde(with =
//! "ts")]`, `#[serde(with = "opt_ts")]`) rather than jiff's own `serde`
//! support: the file is one people edit by hand, and a wrong time there gets
//! an error that shows the expected form (`2026-11-22T08:00:00Z`).

/// A `Timestamp` as RFC 3339 text.
pub mod ts {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Timestamp, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(t)
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Timestamp, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|e| {
            serde::de::Error::custom(format!(
                "`{text}` is not a time ({e}): expected RFC 3339 like `2026-11-22T08:00:00Z`"
            ))
        })
    }
}

/// An `Option<Timestamp>` as RFC 3339 text or `null`.
pub mod opt_ts {
    use jiff::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_none(),
        }
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        #[derive(Deserialize)]
        struct W(#[serde(with = "super::ts")] Timestamp);
        Ok(Option::<W>::deserialize(d)?.map(|W(t)| t))
    }
}
