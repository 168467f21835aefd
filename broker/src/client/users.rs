//! SCRAM users for the admin CLI, over KIP-554's DescribeUserScramCredentials and
//! AlterUserScramCredentials. As Kafka's `kafka-configs --alter --add-config 'SCRAM-SHA-512=[...]'`, the
//! password is salted here, with a random salt: only the salt and the salted password go to the broker.

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::describe_user_scram_credentials_request::UserName;
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, ApiKey, DescribeUserScramCredentialsRequest, ResponseKind,
};
use kafka_protocol::protocol::StrBytes;

use super::{KafkaClient, check_said};
use crate::quorum::security;

const DESCRIBE_V: i16 = 0;
const ALTER_V: i16 = 0;

/// A user and its credentials: (mechanism name, iterations).
pub type ScramUser = (String, Vec<(String, i32)>);

fn mechanism_name(code: i8) -> String {
    security::scram_mechanism_name(code).map_or_else(|| format!("mechanism {code}"), str::to_string)
}

impl KafkaClient {
    /// Adds (or replaces) `user`'s credential for `mechanism` (KIP-554's code).
    pub fn upsert_scram_user(&mut self, user: &str, mechanism: i8, iterations: u32, password: &[u8]) -> Result<()> {
        let salt = security::random_salt(mechanism).context("no random salt could be had from the system")?;
        let salted = security::salt_password(mechanism, password, &salt, iterations)
            .context("the mechanism or the iteration count is not one SCRAM has")?;
        let upsertion = ScramCredentialUpsertion::default()
            .with_name(StrBytes::from_string(user.to_string()))
            .with_mechanism(mechanism)
            .with_iterations(i32::try_from(iterations).context("too many iterations")?)
            .with_salt(Bytes::from(salt))
            .with_salted_password(Bytes::from(salted));
        self.alter_scram(AlterUserScramCredentialsRequest::default().with_upsertions(vec![upsertion]), user)
    }

    /// Removes `user`'s credential for `mechanism`, or (`None`) every credential it has; gives the
    /// mechanisms removed.
    pub fn delete_scram_user(&mut self, user: &str, mechanism: Option<i8>) -> Result<Vec<String>> {
        let mechanisms = match mechanism {
            Some(m) => vec![m],
            None => {
                let (_, credentials) = self.describe_scram(Some(user))?.pop().context("the broker described nobody")?;
                credentials.iter().filter_map(|(name, _)| security::scram_mechanism_code(name)).collect()
            }
        };
        for m in &mechanisms {
            let deletion = ScramCredentialDeletion::default()
                .with_name(StrBytes::from_string(user.to_string()))
                .with_mechanism(*m);
            self.alter_scram(AlterUserScramCredentialsRequest::default().with_deletions(vec![deletion]), user)?;
        }
        Ok(mechanisms.into_iter().map(mechanism_name).collect())
    }

    /// Every user with a SCRAM credential, sorted by name.
    pub fn scram_users(&mut self) -> Result<Vec<ScramUser>> {
        self.describe_scram(None)
    }

    fn describe_scram(&mut self, user: Option<&str>) -> Result<Vec<ScramUser>> {
        let users = user.map(|u| vec![UserName::default().with_name(StrBytes::from_string(u.to_string()))]);
        let req = DescribeUserScramCredentialsRequest::default().with_users(users);
        let ResponseKind::DescribeUserScramCredentials(r) =
            self.call_any(ApiKey::DescribeUserScramCredentials, DESCRIBE_V, &req)?
        else {
            bail!("wrong answer to DescribeUserScramCredentials")
        };
        check_said(r.error_code, r.error_message.as_ref().map(|m| m.as_str()), "describe SCRAM users")?;
        let mut users = Vec::with_capacity(r.results.len());
        for result in r.results {
            let what = format!("describe user {}", result.user.as_str());
            check_said(result.error_code, result.error_message.as_ref().map(|m| m.as_str()), &what)?;
            let credentials =
                result.credential_infos.iter().map(|c| (mechanism_name(c.mechanism), c.iterations)).collect();
            users.push((result.user.to_string(), credentials));
        }
        users.sort();
        Ok(users)
    }

    fn alter_scram(&mut self, req: AlterUserScramCredentialsRequest, user: &str) -> Result<()> {
        let ResponseKind::AlterUserScramCredentials(r) =
            self.call_any(ApiKey::AlterUserScramCredentials, ALTER_V, &req)?
        else {
            bail!("wrong answer to AlterUserScramCredentials")
        };
        let result = r.results.first().context("empty AlterUserScramCredentials answer")?;
        check_said(result.error_code, result.error_message.as_ref().map(|m| m.as_str()), &format!("user {user}"))
    }
}

/// `shardlog user list`'s table: one row per user and mechanism.
pub fn render_users(users: &[ScramUser]) -> String {
    let mut out = format!("{:<32} {:<14} {}\n", "USER", "MECHANISM", "ITERATIONS");
    for (user, credentials) in users {
        for (mechanism, iterations) in credentials {
            out.push_str(&format!("{user:<32} {mechanism:<14} {iterations}\n"));
        }
    }
    out
}
