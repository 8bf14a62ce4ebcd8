//! `mark` lines: named moments a test writes into the log while `record` runs.

use chrono::{DateTime, Utc};
use serde::{Deserialize, Serialize};

/// A named moment (`observer mark NAME --log FILE`): "rollout-start", "rollout-done".
/// `check` and `summary` take `--since-mark NAME` and `--until-mark NAME` to judge only
/// the traffic between two of them.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct MarkRecord {
    pub name: String,
    /// When `observer mark` ran.
    #[serde(with = "super::micros")]
    pub time: DateTime<Utc>,
}
