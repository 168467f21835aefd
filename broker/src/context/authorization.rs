//! The broker's authorizer, kept in step with the ACLs of the metadata image: rebuilt whole (an index
//! of every ACL) the first time a request meets an image whose ACLs changed, and shared by every shard
//! until they change again.

use std::sync::{Arc, Mutex};

use crate::config::AuthorizationConfig;
use crate::metadata::image::MetadataImage;
use crate::security::authorizer::acl::AclBinding;
use crate::security::authorizer::{Authorizer, AuthorizerConfig};

/// The authorizer for the ACLs as of some image.
#[derive(Debug)]
pub struct Authorization {
    config: AuthorizerConfig,
    /// The ACLs' version (`SecurityState::acls_version`) the authorizer was built from.
    current: Mutex<Option<(u64, Arc<Authorizer>)>>,
}

impl Authorization {
    /// `None` when no authorizer is configured: every request is allowed.
    pub fn new(config: &AuthorizationConfig) -> Option<Authorization> {
        config.enabled.then(|| Authorization {
            config: AuthorizerConfig {
                super_users: config.super_users.clone(),
                allow_everyone_if_no_acl_found: config.allow_everyone_if_no_acl_found,
            },
            current: Mutex::new(None),
        })
    }

    /// The authorizer for `image`'s ACLs.
    pub fn authorizer(&self, image: &MetadataImage) -> Arc<Authorizer> {
        let security = image.security();
        let mut current = self.current.lock().expect("never poisoned: nothing panics holding it");
        if let Some((version, authorizer)) = current.as_ref()
            && *version == security.acls_version
        {
            return authorizer.clone();
        }
        // The quorum let in only valid bindings; one this build cannot read (a newer code) is skipped,
        // which denies what it would have allowed and keeps any other rule.
        let bindings = security.acls.iter().filter_map(|acl| {
            AclBinding::from_codes(
                acl.resource_type,
                acl.resource_name.clone(),
                acl.pattern_type,
                acl.principal.clone(),
                acl.host.clone(),
                acl.operation,
                acl.permission_type,
            )
            .ok()
        });
        let authorizer = Arc::new(Authorizer::new(&self.config, bindings));
        *current = Some((security.acls_version, authorizer.clone()));
        authorizer
    }
}
