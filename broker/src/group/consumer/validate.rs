//! The checks of a ConsumerGroupHeartbeat that need no group, and the bounds on what a client may send.

use kafka_protocol::ResponseError;

use super::{ConsumerGroupSettings, Heartbeat, JOIN_EPOCH, Refusal, STATIC_LEAVE_EPOCH, refuse};
use crate::topics::MAX_TOPIC_NAME_LEN;

/// Longest subscription regular expression accepted, in bytes.
pub(super) const MAX_REGEX_BYTES: usize = 4096;
/// The longest member id, instance id or rack id taken: ids are written to records whose strings an
/// int16 counts, and no client makes ids anywhere near this long.
pub(super) const MAX_ID_BYTES: usize = 1024;
/// Most memory one compiled regular expression may take.
const MAX_REGEX_PROGRAM_BYTES: usize = 1 << 20;

/// A subscription's regular expression, matched against whole topic names.
pub(super) fn compile(pattern: &str) -> Result<regex::Regex, regex::Error> {
    regex::RegexBuilder::new(&format!("^(?:{pattern})$")).size_limit(MAX_REGEX_PROGRAM_BYTES).build()
}

/// The checks of a heartbeat that need no group: INVALID_REQUEST for fields the protocol requires,
/// UNSUPPORTED_ASSIGNOR, INVALID_REGULAR_EXPRESSION.
pub(super) fn validate(hb: &Heartbeat, settings: &ConsumerGroupSettings) -> Result<(), Refusal> {
    let invalid = |message: &str| Err(refuse(ResponseError::InvalidRequest, message));
    let ids = [
        ("MemberId", Some(hb.member_id.as_str())),
        ("InstanceId", hb.instance_id.as_deref()),
        ("RackId", hb.rack_id.as_deref()),
    ];
    for (field, id) in ids {
        match id {
            Some(id) if id.trim().is_empty() => return invalid(&format!("{field} can't be empty.")),
            Some(id) if id.len() > MAX_ID_BYTES => {
                return invalid(&format!("{field} is longer than {MAX_ID_BYTES} bytes."));
            }
            _ => {}
        }
    }
    if let Some(name) = hb.subscribed_topic_names.iter().flatten().find(|n| n.len() > MAX_TOPIC_NAME_LEN) {
        return invalid(&format!("SubscribedTopicNames has a name of {} bytes, not a topic name.", name.len()));
    }
    match hb.member_epoch {
        JOIN_EPOCH => {
            if hb.rebalance_timeout_ms < 0 {
                return invalid("RebalanceTimeoutMs must be provided in first request.");
            }
            if hb.subscribed_topic_names.is_none() && hb.subscribed_topic_regex.is_none() {
                return invalid("SubscribedTopicNames or SubscribedTopicRegex must be set in first request.");
            }
            if hb.owned.as_ref().is_none_or(|owned| owned.values().any(|ps| !ps.is_empty())) {
                return invalid("TopicPartitions must be empty when (re-)joining.");
            }
        }
        STATIC_LEAVE_EPOCH if hb.instance_id.is_none() => {
            return invalid("InstanceId can't be null when leaving as a static member.");
        }
        epoch if epoch < STATIC_LEAVE_EPOCH => return invalid("MemberEpoch is invalid."),
        _ => {}
    }
    if let Some(name) = &hb.server_assignor
        && !settings.assignors.iter().any(|a| a.name() == name)
    {
        return Err(refuse(ResponseError::UnsupportedAssignor, format!("assignor {name} is not supported")));
    }
    if let Some(pattern) = hb.subscribed_topic_regex.as_deref().filter(|r| !r.is_empty()) {
        if pattern.len() > MAX_REGEX_BYTES {
            return Err(refuse(
                ResponseError::InvalidRegularExpression,
                format!("the regular expression is longer than {MAX_REGEX_BYTES} bytes"),
            ));
        }
        if let Err(e) = compile(pattern) {
            return Err(refuse(ResponseError::InvalidRegularExpression, e.to_string()));
        }
    }
    Ok(())
}
