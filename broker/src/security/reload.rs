//! Certificate files read again without a restart: every TLS listener's, and this node's cluster mTLS
//! files, when they change (looked at every second) and on SIGHUP. Connections already open keep the
//! certificates they were made with; a changed file that cannot be used is reported once and the
//! previous certificates stay in force.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::{Context, Result};

use super::cluster_tls::ClusterTls;
use super::tls::TlsListener;
use crate::shutdown::Shutdown;

/// How often certificate files are looked at for changes.
const RELOAD_INTERVAL: Duration = Duration::from_secs(1);

/// Starts a thread of its own (it reads files, which shards must not block on) that reloads `listeners`
/// and `cluster` until shutdown. Nothing is started without either, and SIGHUP then keeps its default
/// meaning.
pub fn watch_certificates(
    listeners: Vec<Arc<TlsListener>>,
    cluster: Option<Arc<ClusterTls>>,
    shutdown: Shutdown,
) -> Result<()> {
    if listeners.is_empty() && cluster.is_none() {
        return Ok(());
    }
    let hangup = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGHUP, hangup.clone()).context("handle SIGHUP")?;
    std::thread::Builder::new()
        .name("tls-reload".into())
        .spawn(move || {
            while !shutdown.is_triggered() {
                std::thread::sleep(RELOAD_INTERVAL);
                let forced = hangup.swap(false, Ordering::SeqCst);
                for listener in &listeners {
                    match listener.reload(forced) {
                        Ok(true) => tracing::info!(listener = listener.name(), "TLS files read again"),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(
                            listener = listener.name(),
                            error = %e,
                            "changed TLS files cannot be used; the listener keeps its previous certificates"
                        ),
                    }
                }
                if let Some(cluster) = &cluster {
                    let [keystore, truststore] = cluster.files();
                    match cluster.reload(forced) {
                        Ok(true) => tracing::info!(
                            keystore = %keystore.display(),
                            truststore = %truststore.display(),
                            "cluster mTLS files read again"
                        ),
                        Ok(false) => {}
                        Err(e) => tracing::warn!(
                            error = %e,
                            "changed cluster mTLS files cannot be used; the node keeps its previous certificate"
                        ),
                    }
                }
            }
        })
        .context("start the TLS reload thread")?;
    Ok(())
}
