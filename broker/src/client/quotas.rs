//! Client quotas for `shardlog quota set|describe`, over KIP-546's AlterClientQuotas and
//! DescribeClientQuotas, as `kafka-configs --entity-type users|clients|ips` manages them.
//!
//! An entity is one or more `(type, name)` parts, `user`, `client-id` and `ip`, a `None` name standing for
//! that type's default entity (`--user-default`); a user with a client id is one entity, its own.

use anyhow::{Context, Result, bail};
use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::describe_client_quotas_request::ComponentData;
use kafka_protocol::messages::{AlterClientQuotasRequest, ApiKey, DescribeClientQuotasRequest, ResponseKind};
use kafka_protocol::protocol::StrBytes;

use super::{KafkaClient, check_said};

/// The versions this client speaks.
const QUOTA_VERSIONS: (i16, i16) = (0, 1);

/// DescribeClientQuotas' match types.
const MATCH_EXACT: i8 = 0;
const MATCH_DEFAULT: i8 = 1;

/// One entity: (type, name) pairs; a `None` name is the type's default entity.
pub type Entity = Vec<(String, Option<String>)>;

/// A change to one quota key: `Some(value)` sets it, `None` removes it.
pub type QuotaChange = (String, Option<f64>);

/// An entity and its quota values, as described.
pub type DescribedQuota = (Entity, Vec<(String, f64)>);

fn text(s: &str) -> StrBytes {
    StrBytes::from_string(s.to_string())
}

impl KafkaClient {
    fn quota_version(&mut self, api: ApiKey) -> Result<i16> {
        let home = self.home.clone();
        let version = self.connection(&home)?.negotiate(api, QUOTA_VERSIONS)?;
        Ok(version)
    }

    /// Sets and removes quota keys of one entity.
    pub fn alter_quotas(&mut self, entity: &Entity, changes: &[QuotaChange]) -> Result<()> {
        if changes.is_empty() {
            bail!("no quota to set or remove");
        }
        let entry = EntryData::default()
            .with_entity(
                entity
                    .iter()
                    .map(|(kind, name)| {
                        EntityData::default().with_entity_type(text(kind)).with_entity_name(name.as_deref().map(text))
                    })
                    .collect(),
            )
            .with_ops(
                changes
                    .iter()
                    .map(|(key, value)| {
                        OpData::default()
                            .with_key(text(key))
                            .with_value(value.unwrap_or(0.0))
                            .with_remove(value.is_none())
                    })
                    .collect(),
            );
        let version = self.quota_version(ApiKey::AlterClientQuotas)?;
        let req = AlterClientQuotasRequest::default().with_entries(vec![entry]);
        let ResponseKind::AlterClientQuotas(r) = self.call_any(ApiKey::AlterClientQuotas, version, &req)? else {
            bail!("wrong answer to AlterClientQuotas")
        };
        let result = r.entries.first().context("empty AlterClientQuotas answer")?;
        let what = format!("set quotas of {}", render_entity(entity));
        check_said(result.error_code, result.error_message.as_ref().map(|m| m.as_str()), &what)
    }

    /// The entities with quotas that match `filter` (each part an exact name, or `None` for the
    /// default entity of its type), and their values; with no part, every entity. Not strict: an entity
    /// with more parts than the filter names matches too.
    pub fn describe_quotas(&mut self, filter: &Entity) -> Result<Vec<DescribedQuota>> {
        let components = filter
            .iter()
            .map(|(kind, name)| {
                ComponentData::default()
                    .with_entity_type(text(kind))
                    .with_match_type(if name.is_some() { MATCH_EXACT } else { MATCH_DEFAULT })
                    .with_match(name.as_deref().map(text))
            })
            .collect();
        let version = self.quota_version(ApiKey::DescribeClientQuotas)?;
        let req = DescribeClientQuotasRequest::default().with_components(components).with_strict(false);
        let ResponseKind::DescribeClientQuotas(r) = self.call_any(ApiKey::DescribeClientQuotas, version, &req)? else {
            bail!("wrong answer to DescribeClientQuotas")
        };
        check_said(r.error_code, r.error_message.as_ref().map(|m| m.as_str()), "describe quotas")?;
        let mut out: Vec<DescribedQuota> = (r.entries.unwrap_or_default().into_iter())
            .map(|entry| {
                let mut entity: Entity = (entry.entity.iter())
                    .map(|e| (e.entity_type.to_string(), e.entity_name.as_ref().map(|n| n.to_string())))
                    .collect();
                entity.sort();
                let mut values: Vec<(String, f64)> =
                    entry.values.iter().map(|v| (v.key.to_string(), v.value)).collect();
                values.sort_by(|a, b| a.0.cmp(&b.0));
                (entity, values)
            })
            .collect();
        out.sort_by(|a, b| a.0.cmp(&b.0));
        Ok(out)
    }
}

/// `user=app, client-id=<default>`.
pub fn render_entity(entity: &Entity) -> String {
    let parts: Vec<String> =
        entity.iter().map(|(kind, name)| format!("{kind}={}", name.as_deref().unwrap_or("<default>"))).collect();
    parts.join(", ")
}

/// A quota value as Kafka's tools print it: whole numbers without a fraction.
fn render_value(value: f64) -> String {
    if value.fract() == 0.0 && value.abs() < 1e15 { format!("{}", value as i64) } else { format!("{value}") }
}

/// `shardlog quota describe`'s output: one line per entity with its values.
pub fn render_quotas(quotas: &[DescribedQuota]) -> String {
    let mut out = String::new();
    for (entity, values) in quotas {
        let values: Vec<String> = values.iter().map(|(k, v)| format!("{k}={}", render_value(*v))).collect();
        out.push_str(&format!("{}: {}\n", render_entity(entity), values.join(", ")));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entities_and_values_print_as_kafka_configs_shows_them() {
        let quotas = vec![(
            vec![("client-id".to_string(), None), ("user".to_string(), Some("app".to_string()))],
            vec![("producer_byte_rate".to_string(), 1_048_576.0), ("request_percentage".to_string(), 12.5)],
        )];
        assert_eq!(
            render_quotas(&quotas),
            "client-id=<default>, user=app: producer_byte_rate=1048576, request_percentage=12.5\n"
        );
    }
}
