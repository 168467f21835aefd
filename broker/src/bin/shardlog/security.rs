//! `shardlog user`, `shardlog acl` and `shardlog quota`: the cluster's SCRAM users, ACLs and client quotas,
//! managed through Kafka's admin APIs (docs/security.md §5-§7).

use std::path::PathBuf;

use anyhow::{Context, Result};
use clap::{Args, Subcommand};

use crate::{Bootstrap, Secret};

#[derive(Debug, Subcommand)]
pub(crate) enum UserCommand {
    /// Add a user's SCRAM credential, or replace the one it has for that mechanism.
    Create {
        name: String,
        /// SCRAM-SHA-256 or SCRAM-SHA-512.
        #[arg(long, default_value = "SCRAM-SHA-512")]
        mechanism: String,
        /// The password (visible to other users of this host in the process list: prefer
        /// --password-file).
        #[arg(long, required_unless_present = "password_file", conflicts_with = "password_file")]
        password: Option<Secret>,
        /// A file whose content (without the final newline) is the password.
        #[arg(long)]
        password_file: Option<PathBuf>,
        /// PBKDF2 iterations, 4096 to 16384 (Kafka's bounds).
        #[arg(long, default_value_t = 4096)]
        iterations: u32,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Remove a user's SCRAM credential for one mechanism, or all of them.
    Delete {
        name: String,
        /// Only this mechanism's credential (default: every one the user has).
        #[arg(long)]
        mechanism: Option<String>,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Every user with a SCRAM credential: mechanism and iterations.
    List {
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
}

/// The resources and principals an `acl` command is about.
#[derive(Debug, Args)]
pub(crate) struct AclArgs {
    /// A principal allowed, TYPE:NAME (`User:alice`; repeatable).
    #[arg(long = "allow-principal", value_name = "PRINCIPAL")]
    allow_principals: Vec<String>,
    /// A principal denied, TYPE:NAME (repeatable).
    #[arg(long = "deny-principal", value_name = "PRINCIPAL")]
    deny_principals: Vec<String>,
    /// A host the allowed principals come from (repeatable; default `*`, any).
    #[arg(long = "allow-host", value_name = "HOST")]
    allow_hosts: Vec<String>,
    /// A host the denied principals come from (repeatable; default `*`, any).
    #[arg(long = "deny-host", value_name = "HOST")]
    deny_hosts: Vec<String>,
    /// Read, Write, Create, Delete, Alter, Describe, ClusterAction, DescribeConfigs, AlterConfigs,
    /// IdempotentWrite, All (repeatable; `add` defaults to All, `list` and `remove` to any).
    #[arg(long = "operation", value_name = "OPERATION")]
    operations: Vec<String>,
    /// A topic (repeatable; `*` is every topic).
    #[arg(long = "topic", value_name = "TOPIC")]
    topics: Vec<String>,
    /// A consumer group (repeatable).
    #[arg(long = "group", value_name = "GROUP")]
    groups: Vec<String>,
    /// The cluster.
    #[arg(long)]
    cluster: bool,
    /// A transactional id (repeatable).
    #[arg(long = "transactional-id", value_name = "ID")]
    transactional_ids: Vec<String>,
    /// literal or prefixed for `add` (default literal); for `list` and `remove` also any, or match
    /// (every binding that applies to the resource named). Default: literal, or any for a `list` of all.
    #[arg(long, value_name = "TYPE")]
    resource_pattern_type: Option<String>,
    #[command(flatten)]
    bootstrap: Bootstrap,
}

impl AclArgs {
    fn flags(&self, principal: Option<String>) -> shardlog_broker::admin_cli::security::AclFlags {
        shardlog_broker::admin_cli::security::AclFlags {
            allow_principals: self.allow_principals.clone(),
            deny_principals: self.deny_principals.clone(),
            allow_hosts: self.allow_hosts.clone(),
            deny_hosts: self.deny_hosts.clone(),
            operations: self.operations.clone(),
            topics: self.topics.clone(),
            groups: self.groups.clone(),
            cluster: self.cluster,
            transactional_ids: self.transactional_ids.clone(),
            pattern_type: self.resource_pattern_type.clone(),
            principal,
        }
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum AclCommand {
    /// Add bindings: each principal, from each host, is allowed or denied each operation on each
    /// resource.
    Add(AclArgs),
    /// List the bindings that match, one per line (every binding without a filter).
    List {
        /// Only the bindings of this principal, TYPE:NAME.
        #[arg(long)]
        principal: Option<String>,
        #[command(flatten)]
        acl: AclArgs,
    },
    /// Remove the bindings that match (a resource is required; without principals, every binding on
    /// it), and print them.
    Remove(AclArgs),
}

/// The entity a `quota` command is about: a user, a client id, both, or an IP address.
#[derive(Debug, Args)]
pub(crate) struct QuotaEntityArgs {
    /// A user (its principal's name).
    #[arg(long, conflicts_with = "user_default")]
    user: Option<String>,
    /// The default of all users.
    #[arg(long)]
    user_default: bool,
    /// A client id.
    #[arg(long, conflicts_with = "client_default")]
    client_id: Option<String>,
    /// The default of all client ids.
    #[arg(long)]
    client_default: bool,
    /// An IP address (connection creation rate only).
    #[arg(long, conflicts_with = "ip_default")]
    ip: Option<String>,
    /// The default of all IP addresses.
    #[arg(long)]
    ip_default: bool,
}

impl QuotaEntityArgs {
    fn entity(&self) -> Result<shardlog_broker::client::Entity> {
        shardlog_broker::admin_cli::security::QuotaEntityFlags {
            user: self.user.clone(),
            user_default: self.user_default,
            client_id: self.client_id.clone(),
            client_default: self.client_default,
            ip: self.ip.clone(),
            ip_default: self.ip_default,
        }
        .entity()
    }
}

#[derive(Debug, Subcommand)]
pub(crate) enum QuotaCommand {
    /// Set (or with --delete remove) quotas of one entity.
    Set {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        /// Bytes per second a producer may send (`producer_byte_rate`).
        #[arg(long)]
        producer_byte_rate: Option<f64>,
        /// Bytes per second a consumer may fetch (`consumer_byte_rate`).
        #[arg(long)]
        consumer_byte_rate: Option<f64>,
        /// Percent of one request-handling thread's time (`request_percentage`).
        #[arg(long)]
        request_percentage: Option<f64>,
        /// New connections per second (`connection_creation_rate`).
        #[arg(long)]
        connection_creation_rate: Option<f64>,
        /// Remove a quota key, by Kafka's name (`producer_byte_rate`, ...; repeatable).
        #[arg(long = "delete", value_name = "KEY")]
        delete: Vec<String>,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
    /// Print the entities with quotas and their values (only those matching the entity flags given).
    Describe {
        #[command(flatten)]
        entity: QuotaEntityArgs,
        #[command(flatten)]
        bootstrap: Bootstrap,
    },
}

fn scram_mechanism(name: &str) -> Result<i8> {
    shardlog_broker::quorum::security::scram_mechanism_code(name)
        .with_context(|| format!("--mechanism {name:?}: SCRAM-SHA-256 or SCRAM-SHA-512"))
}

pub(crate) fn user(command: UserCommand) -> Result<()> {
    match command {
        UserCommand::Create { name, mechanism, password, password_file, iterations, bootstrap } => {
            let code = scram_mechanism(&mechanism)?;
            let password = match (password, password_file) {
                (Some(p), _) => p.0,
                (None, Some(file)) => {
                    let text = std::fs::read_to_string(&file)
                        .with_context(|| format!("--password-file {}", file.display()))?;
                    text.strip_suffix('\n').map(|t| t.strip_suffix('\r').unwrap_or(t)).unwrap_or(&text).to_string()
                }
                (None, None) => anyhow::bail!("--password or --password-file is needed"),
            };
            if password.is_empty() {
                anyhow::bail!("the password is empty");
            }
            bootstrap.connect()?.upsert_scram_user(&name, code, iterations, password.as_bytes())?;
            println!("Created {mechanism} credential for user {name}.");
        }
        UserCommand::Delete { name, mechanism, bootstrap } => {
            let code = mechanism.as_deref().map(scram_mechanism).transpose()?;
            let removed = bootstrap.connect()?.delete_scram_user(&name, code)?;
            println!("Deleted {} credential(s) of user {name}.", removed.join(", "));
        }
        UserCommand::List { bootstrap } => {
            print!("{}", shardlog_broker::client::render_users(&bootstrap.connect()?.scram_users()?))
        }
    }
    Ok(())
}

pub(crate) fn acl(command: AclCommand) -> Result<()> {
    use shardlog_broker::client::render_acls;
    match command {
        AclCommand::Add(args) => {
            let bindings = args.flags(None).bindings()?;
            args.bootstrap.connect()?.create_acls(&bindings)?;
            println!("Added {} ACL binding(s):", bindings.len());
            print!("{}", render_acls(&bindings));
        }
        AclCommand::List { principal, acl } => {
            let filters = acl.flags(principal).filters(false)?;
            let mut client = acl.bootstrap.connect()?;
            let mut bindings = Vec::new();
            for filter in &filters {
                bindings.extend(client.describe_acls(filter)?);
            }
            bindings.sort();
            bindings.dedup();
            print!("{}", render_acls(&bindings));
        }
        AclCommand::Remove(args) => {
            let filters = args.flags(None).filters(true)?;
            let removed = args.bootstrap.connect()?.delete_acls(&filters)?;
            println!("Removed {} ACL binding(s):", removed.len());
            print!("{}", render_acls(&removed));
        }
    }
    Ok(())
}

pub(crate) fn quota(command: QuotaCommand) -> Result<()> {
    use shardlog_broker::quorum::security::{
        CONNECTION_CREATION_RATE, CONSUMER_BYTE_RATE, PRODUCER_BYTE_RATE, REQUEST_PERCENTAGE,
    };
    match command {
        QuotaCommand::Set {
            entity,
            producer_byte_rate,
            consumer_byte_rate,
            request_percentage,
            connection_creation_rate,
            delete,
            bootstrap,
        } => {
            let entity = entity.entity()?;
            if entity.is_empty() {
                anyhow::bail!("name the entity: --user, --client-id, --ip or their --*-default");
            }
            let mut changes: Vec<shardlog_broker::client::QuotaChange> = [
                (PRODUCER_BYTE_RATE, producer_byte_rate),
                (CONSUMER_BYTE_RATE, consumer_byte_rate),
                (REQUEST_PERCENTAGE, request_percentage),
                (CONNECTION_CREATION_RATE, connection_creation_rate),
            ]
            .into_iter()
            .filter_map(|(key, value)| Some((key.to_string(), Some(value?))))
            .collect();
            changes.extend(delete.into_iter().map(|key| (key, None)));
            if changes.is_empty() {
                anyhow::bail!(
                    "nothing to set: give --producer-byte-rate, --consumer-byte-rate, --request-percentage, \
                     --connection-creation-rate or --delete KEY"
                );
            }
            bootstrap.connect()?.alter_quotas(&entity, &changes)?;
            println!("Updated quotas of {}.", shardlog_broker::client::render_entity(&entity));
        }
        QuotaCommand::Describe { entity, bootstrap } => {
            let quotas = bootstrap.connect()?.describe_quotas(&entity.entity()?)?;
            print!("{}", shardlog_broker::client::render_quotas(&quotas));
        }
    }
    Ok(())
}
