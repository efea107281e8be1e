//! Building the `kube::Client`: `KUBECONFIG_PATH` when set, else the
//! in-cluster service account, else the default kubeconfig
//! (`$KUBECONFIG` or `~/.kube/config`). Credentials are never logged.

use std::path::Path;
use std::time::Duration;

use kube::config::{KubeConfigOptions, Kubeconfig};
use tracing::info;

use super::KubeError;

/// Loads the client configuration in the documented order.
pub async fn load_config(kubeconfig_path: Option<&Path>) -> Result<kube::Config, KubeError> {
    if let Some(path) = kubeconfig_path {
        let kc = Kubeconfig::read_from(path)
            .map_err(|e| KubeError::Credentials(format!("kubeconfig {}: {e}", path.display())))?;
        let cfg = kube::Config::from_custom_kubeconfig(kc, &KubeConfigOptions::default())
            .await
            .map_err(|e| KubeError::Credentials(format!("kubeconfig {}: {e}", path.display())))?;
        info!(source = "kubeconfig_path", path = %path.display(), cluster = %cfg.cluster_url,
              "kubernetes credentials loaded");
        return Ok(cfg);
    }
    match kube::Config::incluster() {
        Ok(cfg) => {
            info!(source = "in-cluster", cluster = %cfg.cluster_url, "kubernetes credentials loaded");
            Ok(cfg)
        }
        Err(in_cluster) => {
            let cfg = kube::Config::from_kubeconfig(&KubeConfigOptions::default())
                .await
                .map_err(|e| {
                    KubeError::Credentials(format!(
                        "not in a cluster ({in_cluster}) and no default kubeconfig ({e})"
                    ))
                })?;
            info!(source = "default kubeconfig", cluster = %cfg.cluster_url,
                  "kubernetes credentials loaded");
            Ok(cfg)
        }
    }
}

/// Bound on connecting to the API server.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// Bound on one API call's response (kube's default is almost 5 minutes:
/// far longer than any create or discover may block).
const READ_TIMEOUT: Duration = Duration::from_secs(30);

/// A client for `cfg`, with bounded connect/read timeouts.
pub fn client(mut cfg: kube::Config) -> Result<kube::Client, KubeError> {
    cfg.connect_timeout = Some(CONNECT_TIMEOUT);
    cfg.read_timeout = Some(READ_TIMEOUT);
    cfg.write_timeout = Some(READ_TIMEOUT);
    kube::Client::try_from(cfg).map_err(|e| KubeError::Client(Box::new(e)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An https cluster needs a working TLS stack (a rustls crypto
    /// provider): building the client must not fail or panic.
    #[tokio::test]
    async fn https_client_builds_from_a_kubeconfig() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("kubeconfig");
        std::fs::write(
            &path,
            "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:1\n    insecure-skip-tls-verify: false\ncontexts:\n- name: c\n  context:\n    cluster: c\n    user: u\ncurrent-context: c\nusers:\n- name: u\n  user:\n    token: not-a-real-token\n",
        )
        .unwrap();
        let cfg = load_config(Some(&path)).await.unwrap();
        assert_eq!(cfg.cluster_url.scheme_str(), Some("https"));
        client(cfg).unwrap();
        let e = load_config(Some(&dir.path().join("missing")))
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing"), "{e}");
    }
}
