//! Operator commands that talk to the local daemon's API: `sandboxd ls`,
//! `sandboxd inspect ID`, `sandboxd rm ID`. They read the same config and
//! token as the daemon but never create a token (only the daemon does).
//! hyper's HTTP/1 client connection (`hyper::client::conn::http1`) over a
//! tokio TCP or Unix stream, on a current-thread runtime of the command's
//! own: one request per connection, `Connection: close`.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context};
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::TokioIo;
use serde_json::Value;

use crate::api::auth;
use crate::config::{parse_dotenv, Config, EnvSource, ProcessEnv};

/// Where the systemd unit keeps the daemon's config and env file; used by
/// default when present, so `sandboxd ls` on a node needs no flags.
const UNIT_CONFIG: &str = "/etc/sandboxd/config.toml";
const UNIT_ENV_FILE: &str = "/etc/sandboxd/sandboxd.env";

/// How to reach the daemon (shared by `ls`, `inspect`, `rm`).
#[derive(Debug, clap::Args)]
pub struct Target {
    /// Daemon config file (also SANDBOXD_CONFIG; default /etc/sandboxd/config.toml
    /// when it exists): where it listens, its token.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// The daemon's env file (default /etc/sandboxd/sandboxd.env when it
    /// exists); our own environment wins over it.
    #[arg(long)]
    pub env_file: Option<PathBuf>,
    /// API address: `http://HOST:PORT` or `unix:/path/to/api.sock`
    /// (default: the configured unix_socket, else the configured listen address).
    #[arg(long)]
    pub url: Option<String>,
    /// State directory holding the daemon's generated token (also SANDBOXD_STATE_DIR).
    #[arg(long)]
    pub state_dir: Option<PathBuf>,
}

#[derive(Debug, clap::Args)]
pub struct RmArgs {
    #[command(flatten)]
    pub target: Target,
    /// The sandbox to delete.
    pub id: String,
    /// Delete only if the sandbox is still this generation (else exit 1).
    #[arg(long)]
    pub expected_generation: Option<String>,
}

#[derive(Debug, clap::Args)]
pub struct LogsArgs {
    #[command(flatten)]
    pub target: Target,
    /// The sandbox whose output to print.
    pub id: String,
    /// Keep printing new lines (once a second) until the sandbox is gone.
    #[arg(long, short = 'f')]
    pub follow: bool,
}

#[derive(Debug, clap::Args)]
pub struct InspectArgs {
    #[command(flatten)]
    pub target: Target,
    /// The sandbox to show.
    pub id: String,
}

enum Endpoint {
    Tcp(String),
    Unix(PathBuf),
}

struct Api {
    endpoint: Endpoint,
    token: String,
    /// Drives the client connections (the commands are synchronous).
    rt: tokio::runtime::Runtime,
}

/// How long a request may take, connection to last body byte.
const CALL_TIMEOUT: Duration = Duration::from_secs(120);

/// The process environment over the daemon's env file, as the daemon sees
/// it under systemd (`EnvironmentFile=`).
struct Layered(BTreeMap<String, String>);

impl EnvSource for Layered {
    fn get(&self, name: &str) -> Option<String> {
        ProcessEnv.get(name).or_else(|| self.0.get(name).cloned())
    }
}

/// The daemon's configuration as the daemon on this node sees it: the
/// config file (`config`, else `SANDBOXD_CONFIG`, else the unit's when it
/// exists), the environment over the env file (`env_file`, else the
/// unit's), `state_dir` over both. Shared by the operator commands.
#[cfg_attr(not(feature = "images"), allow(dead_code))]
pub(crate) fn node_config(
    config: Option<&Path>,
    env_file: Option<&Path>,
    state_dir: Option<&Path>,
) -> anyhow::Result<Config> {
    let t = Target {
        config: config.map(Path::to_path_buf),
        env_file: env_file.map(Path::to_path_buf),
        url: None,
        state_dir: state_dir.map(Path::to_path_buf),
    };
    Api::config_of(&t)
}

impl Api {
    fn config_of(t: &Target) -> anyhow::Result<Config> {
        let env_file = match &t.env_file {
            Some(p) => Some(p.clone()),
            None => Some(PathBuf::from(UNIT_ENV_FILE)).filter(|p| p.exists()),
        };
        let file_env = match &env_file {
            Some(p) => {
                let text = std::fs::read_to_string(p)
                    .with_context(|| format!("cannot read env file {}", p.display()))?;
                parse_dotenv(&text).map_err(|e| anyhow::anyhow!("env file {}: {e}", p.display()))?
            }
            None => BTreeMap::new(),
        };
        let env = Layered(file_env);
        let config = t.config.clone().or_else(|| {
            (env.get("SANDBOXD_CONFIG").is_none() && Path::new(UNIT_CONFIG).exists())
                .then(|| PathBuf::from(UNIT_CONFIG))
        });
        let mut cfg = Config::load(config.as_deref(), &env)?;
        if let Some(d) = &t.state_dir {
            cfg.state_dir = d.clone();
        }
        Ok(cfg)
    }

    fn from_target(t: &Target) -> anyhow::Result<Api> {
        let cfg = Api::config_of(t)?;
        let endpoint = match &t.url {
            Some(u) => parse_url(u)?,
            None => match &cfg.unix_socket {
                Some(p) => Endpoint::Unix(p.clone()),
                None => Endpoint::Tcp(connect_addr(&cfg.listen)?),
            },
        };
        // Same resolution as the daemon, minus generation: a CLI that
        // invented a token would lock the operator out of a running daemon.
        let stored = cfg.state_dir.join("token");
        if cfg.token.is_none() && cfg.token_file.is_none() && !stored.exists() {
            bail!(
                "no API token found: set SANDBOX_PROVISIONER_TOKEN (environment or --env-file), \
                 `token` or `token_file` in the config (--config), or point --state-dir at the \
                 daemon's state dir ({} has no token)",
                cfg.state_dir.display()
            );
        }
        let token = auth::load_token(
            cfg.token.as_deref(),
            cfg.token_file.as_deref(),
            &cfg.state_dir,
        )?;
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_io()
            .enable_time()
            .build()
            .context("starting the client's runtime")?;
        Ok(Api {
            endpoint,
            token: token.expose().to_string(),
            rt,
        })
    }

    /// Sends one request; returns the status and the JSON body.
    fn call(&self, method: &str, path: &str) -> anyhow::Result<(u16, Value)> {
        let (status, body) = self.call_raw(method, path)?;
        Ok((status, serde_json::from_slice(&body).unwrap_or(Value::Null)))
    }

    /// Like [`call`](Self::call), the body as bytes.
    fn call_raw(&self, method: &str, path: &str) -> anyhow::Result<(u16, Vec<u8>)> {
        let req = http::Request::builder()
            .method(method)
            .uri(path)
            .header(http::header::HOST, "localhost")
            .header(
                http::header::AUTHORIZATION,
                format!("Bearer {}", self.token),
            )
            .header(http::header::CONTENT_LENGTH, "0")
            .header(http::header::CONNECTION, "close")
            .body(Empty::<Bytes>::new())
            .context("building the request")?;
        self.rt.block_on(async {
            match tokio::time::timeout(CALL_TIMEOUT, self.send(req)).await {
                Ok(r) => r,
                Err(_) => Err(anyhow::anyhow!(
                    "the daemon did not answer within {} s",
                    CALL_TIMEOUT.as_secs()
                )),
            }
        })
    }

    async fn send(&self, req: http::Request<Empty<Bytes>>) -> anyhow::Result<(u16, Vec<u8>)> {
        match &self.endpoint {
            Endpoint::Tcp(a) => {
                let s = tokio::net::TcpStream::connect(a.as_str())
                    .await
                    .with_context(|| format!("cannot connect to the daemon at {a}"))?;
                exchange(TokioIo::new(s), req).await
            }
            Endpoint::Unix(p) => {
                let s = tokio::net::UnixStream::connect(p).await.with_context(|| {
                    format!("cannot connect to the daemon at unix:{}", p.display())
                })?;
                exchange(TokioIo::new(s), req).await
            }
        }
    }
}

/// One request on a fresh connection; the status and the whole body
/// (hyper undoes the chunked encoding).
async fn exchange<S>(io: S, req: http::Request<Empty<Bytes>>) -> anyhow::Result<(u16, Vec<u8>)>
where
    S: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
{
    let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
        .await
        .context("talking to the daemon")?;
    // The connection is driven while we wait for the answer; it ends with
    // the exchange (`Connection: close`) or when this command returns.
    let conn = tokio::spawn(conn);
    let resp = sender
        .send_request(req)
        .await
        .context("reading the daemon's answer")?;
    let status = resp.status().as_u16();
    let body = resp
        .into_body()
        .collect()
        .await
        .context("reading the daemon's answer")?
        .to_bytes()
        .to_vec();
    drop(sender);
    conn.abort();
    Ok((status, body))
}

fn parse_url(u: &str) -> anyhow::Result<Endpoint> {
    if let Some(p) = u.strip_prefix("unix:") {
        return Ok(Endpoint::Unix(PathBuf::from(p)));
    }
    match u.strip_prefix("http://") {
        Some(rest) => Ok(Endpoint::Tcp(rest.trim_end_matches('/').to_string())),
        None => bail!("--url {u:?}: expected http://HOST:PORT or unix:/path"),
    }
}

/// The address to connect to for a listen address (a wildcard listen
/// address is reached over loopback).
fn connect_addr(listen: &str) -> anyhow::Result<String> {
    let mut a: std::net::SocketAddr = listen
        .parse()
        .with_context(|| format!("listen address {listen:?}"))?;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            std::net::SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            std::net::SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    Ok(a.to_string())
}

fn detail(v: &Value) -> String {
    v["detail"]
        .as_str()
        .map(str::to_string)
        .unwrap_or_else(|| v.to_string())
}

fn check_id(id: &str) -> anyhow::Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 63
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'_');
    if !ok {
        bail!("{id:?} is not a sandbox id ([A-Za-z0-9_-]{{1,63}})");
    }
    Ok(())
}

/// `sandboxd ls`: one line per sandbox.
pub fn ls(t: Target) -> anyhow::Result<i32> {
    let api = Api::from_target(&t)?;
    let (status, v) = api.call("GET", "/api/sandboxes")?;
    if status != 200 {
        bail!("listing sandboxes failed ({status}): {}", detail(&v));
    }
    let rows: Vec<[String; 5]> = v["sandboxes"]
        .as_array()
        .map(Vec::as_slice)
        .unwrap_or_default()
        .iter()
        .map(|s| {
            let text = |k: &str| s[k].as_str().unwrap_or("-").to_string();
            let oom = match s["oom_killed"].as_bool() {
                Some(true) => "yes",
                Some(false) => "no",
                None => "-",
            };
            [
                text("sandbox_id"),
                text("status"),
                text("generation"),
                text("workdir_path"),
                oom.to_string(),
            ]
        })
        .collect();
    print!(
        "{}",
        table(["ID", "STATUS", "GENERATION", "WORKDIR", "OOM"], &rows)
    );
    Ok(0)
}

fn table(header: [&str; 5], rows: &[[String; 5]]) -> String {
    let mut width = header.map(str::len);
    for r in rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.len());
        }
    }
    let line = |cells: [&str; 5]| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i + 1 == cells.len() {
                l.push_str(c);
            } else {
                l.push_str(&format!("{c:<w$}  "));
            }
        }
        l.push('\n');
        l
    };
    let mut out = line(header);
    for r in rows {
        out.push_str(&line([&r[0], &r[1], &r[2], &r[3], &r[4]]));
    }
    out
}

/// `sandboxd inspect ID`: the sandbox's record as JSON.
pub fn inspect(a: InspectArgs) -> anyhow::Result<i32> {
    check_id(&a.id)?;
    let api = Api::from_target(&a.target)?;
    let (status, v) = api.call("GET", &format!("/api/sandboxes/{}", a.id))?;
    match status {
        200 => {
            println!("{}", serde_json::to_string_pretty(&v)?);
            Ok(0)
        }
        404 => bail!("sandbox {} not found", a.id),
        s => bail!("inspecting sandbox {} failed ({s}): {}", a.id, detail(&v)),
    }
}

/// `sandboxd logs ID`: the recent output of the sandbox's PID 1 (the
/// daemon keeps the last 64 KiB per sandbox, with timestamps).
pub fn logs(a: LogsArgs) -> anyhow::Result<i32> {
    check_id(&a.id)?;
    let api = Api::from_target(&a.target)?;
    let path = format!("/api/sandboxes/{}/logs", a.id);
    let mut printed: Option<String> = None;
    loop {
        let (status, body) = api.call_raw("GET", &path)?;
        match status {
            200 => {
                let text = String::from_utf8_lossy(&body);
                let lines: Vec<&str> = text.lines().collect();
                // Only what follows the last line already printed (each
                // line carries its time, so a repeat is the same line).
                let start = printed
                    .as_deref()
                    .and_then(|last| lines.iter().rposition(|l| *l == last))
                    .map_or(0, |i| i + 1);
                let mut out = std::io::stdout().lock();
                for l in &lines[start..] {
                    writeln!(out, "{l}")?;
                }
                out.flush()?;
                if let Some(l) = lines.last() {
                    printed = Some(l.to_string());
                }
            }
            404 if a.follow && printed.is_some() => {
                eprintln!("sandbox {} is gone", a.id);
                return Ok(0);
            }
            s => {
                let v: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
                bail!("logs of sandbox {} ({s}): {}", a.id, detail(&v))
            }
        }
        if !a.follow {
            return Ok(0);
        }
        std::thread::sleep(Duration::from_secs(1));
    }
}

/// `sandboxd rm ID [--expected-generation G]`.
pub fn rm(a: RmArgs) -> anyhow::Result<i32> {
    check_id(&a.id)?;
    let mut path = format!("/api/sandboxes/{}", a.id);
    if let Some(g) = &a.expected_generation {
        if !g
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
        {
            bail!("--expected-generation {g:?}: not a generation");
        }
        path.push_str(&format!("?expected_generation={g}"));
    }
    let api = Api::from_target(&a.target)?;
    let (status, v) = api.call("DELETE", &path)?;
    match status {
        200 => {
            println!("deleted sandbox {}", a.id);
            Ok(0)
        }
        404 => bail!("sandbox {} not found", a.id),
        409 => match &a.expected_generation {
            Some(g) => bail!(
                "sandbox {} was not deleted: it is not generation {g} ({})",
                a.id,
                detail(&v)
            ),
            None => bail!("sandbox {} was not deleted: {}", a.id, detail(&v)),
        },
        s => bail!("deleting sandbox {} failed ({s}): {}", a.id, detail(&v)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A one-shot HTTP server on loopback that answers `response` and
    /// hands back the request it read.
    fn one_shot(response: &'static [u8]) -> (String, std::thread::JoinHandle<String>) {
        use std::io::Read;
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        let h = std::thread::spawn(move || {
            let (mut s, _) = l.accept().unwrap();
            let mut req = Vec::new();
            let mut buf = [0u8; 1024];
            while !req.ends_with(b"\r\n\r\n") {
                let n = s.read(&mut buf).unwrap();
                assert!(n > 0, "request cut short");
                req.extend_from_slice(&buf[..n]);
            }
            s.write_all(response).unwrap();
            String::from_utf8(req).unwrap()
        });
        (addr, h)
    }

    fn api(endpoint: Endpoint) -> Api {
        Api {
            endpoint,
            token: "t0k3n".into(),
            rt: tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap(),
        }
    }

    #[test]
    fn sends_the_token_and_reads_plain_and_chunked_answers() {
        let (addr, h) = one_shot(
            b"HTTP/1.1 409 Conflict\r\ncontent-length: 14\r\nconnection: close\r\n\r\n{\"detail\":\"x\"}",
        );
        let (s, v) = api(Endpoint::Tcp(addr))
            .call("DELETE", "/api/sandboxes/a?expected_generation=g")
            .unwrap();
        assert_eq!(s, 409);
        assert_eq!(detail(&v), "x");
        let req = h.join().unwrap().to_ascii_lowercase();
        assert!(
            req.starts_with("delete /api/sandboxes/a?expected_generation=g http/1.1\r\n"),
            "{req}"
        );
        assert!(req.contains("\r\nauthorization: bearer t0k3n\r\n"), "{req}");

        let (addr, h) = one_shot(
            b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n4\r\n{\"a\"\r\n3\r\n:1}\r\n0\r\n\r\n",
        );
        let (s, v) = api(Endpoint::Tcp(addr)).call("GET", "/x").unwrap();
        assert_eq!(s, 200);
        assert_eq!(v["a"], 1);
        h.join().unwrap();
    }

    #[test]
    fn no_daemon_is_a_clear_error() {
        // A port nobody listens on: bound, then closed.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let e = api(Endpoint::Tcp(addr.clone()))
            .call("GET", "/api/sandboxes")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot connect to the daemon at {addr}")
        );
        let dir = tempfile::tempdir().unwrap();
        let sock = dir.path().join("api.sock");
        let e = api(Endpoint::Unix(sock.clone()))
            .call("GET", "/api/sandboxes")
            .unwrap_err();
        assert_eq!(
            e.to_string(),
            format!("cannot connect to the daemon at unix:{}", sock.display())
        );
    }

    #[test]
    fn a_cut_answer_is_an_error() {
        let (addr, h) = one_shot(b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\n{\"a\"");
        let e = api(Endpoint::Tcp(addr)).call("GET", "/x").unwrap_err();
        assert_eq!(e.to_string(), "reading the daemon's answer");
        h.join().unwrap();
    }

    #[test]
    fn addresses() {
        assert_eq!(connect_addr("0.0.0.0:8002").unwrap(), "127.0.0.1:8002");
        assert_eq!(connect_addr("[::]:9").unwrap(), "[::1]:9");
        assert!(matches!(
            parse_url("unix:/run/x.sock").unwrap(),
            Endpoint::Unix(_)
        ));
        assert!(parse_url("https://x").is_err());
    }

    #[test]
    fn table_aligns() {
        let t = table(
            ["ID", "STATUS", "GENERATION", "WORKDIR", "OOM"],
            &[[
                "abc".into(),
                "running".into(),
                "g1".into(),
                "-".into(),
                "no".into(),
            ]],
        );
        assert_eq!(
            t,
            "ID   STATUS   GENERATION  WORKDIR  OOM\nabc  running  g1          -        no\n"
        );
    }
}
