//! A warm-pool member's agent (`--pooled`): started before any user is
//! known, it answers nothing but `POST /internal/claim` until the daemon
//! claims it for one user, once. The claim carries what the agent of a
//! cold-started sandbox gets at start (the command environment and the
//! working directory); the answer carries the device and inode of what is
//! mounted at the user-data and skills paths, so the daemon can check that
//! the user's directories really arrived before it answers the create.
//!
//! One-shot by construction: the claim builds the route table, and from
//! then on every request goes to it, which has no `/internal/claim` (404).
//! No process of the sandbox runs before the claim (nothing of a user was
//! ever in it), so only the daemon can reach this endpoint then; see
//! `docs/security.md` (warm pool).

use std::ffi::OsString;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, OnceLock};

use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};

use super::body::AgentBody;
use super::editor::Editor;
use super::envelope::{ok, ApiError};
use super::exec::{Exec, ExecConfig};
use super::paths::PathBase;
use super::reaper::Reaper;
use super::request::json_body;
use super::routes::Routes;

pub use sandbox_abi::claim::{ClaimAnswer, ClaimRequest, FileId, CLAIM_PATH};

/// What the route table is made of once claimed.
struct Pending {
    exec: ExecConfig,
    base: PathBase,
    reaper: Arc<Reaper>,
}

/// The route table of an agent: built at start, or (pooled) by the claim.
pub struct Gate {
    routes: OnceLock<Arc<Routes>>,
    pending: Mutex<Option<Pending>>,
}

impl Gate {
    /// An agent that serves at once.
    pub fn open(routes: Routes) -> Gate {
        let gate = Gate {
            routes: OnceLock::new(),
            pending: Mutex::new(None),
        };
        let _ = gate.routes.set(Arc::new(routes));
        gate
    }

    /// A pool member's agent: serves once claimed.
    pub fn pooled(exec: ExecConfig, base: PathBase, reaper: Arc<Reaper>) -> Gate {
        Gate {
            routes: OnceLock::new(),
            pending: Mutex::new(Some(Pending { exec, base, reaper })),
        }
    }

    /// The route table, once there is one.
    pub fn routes(&self) -> Option<Arc<Routes>> {
        self.routes.get().cloned()
    }

    /// Handles a request before the claim.
    pub async fn unclaimed(&self, req: Request<Incoming>) -> Response<AgentBody> {
        if req.method() != Method::POST || req.uri().path() != CLAIM_PATH {
            return ApiError {
                status: StatusCode::SERVICE_UNAVAILABLE,
                message: "this sandbox is not claimed yet".into(),
            }
            .into_response();
        }
        let body: ClaimRequest = match json_body(req.into_body()).await {
            Ok(b) => b,
            Err(e) => return ApiError::from(e).into_response(),
        };
        match self.claim(body) {
            Ok(answer) => ok("Claimed", &answer),
            Err(e) => e.into_response(),
        }
    }

    fn claim(&self, req: ClaimRequest) -> Result<ClaimAnswer, ApiError> {
        // A bad claim changes nothing: the agent stays claimable.
        let env = parse_env(&req.env)?;
        let mut pending = self.pending.lock().unwrap_or_else(|e| e.into_inner());
        let Some(p) = pending.take() else {
            return Err(ApiError {
                status: StatusCode::CONFLICT,
                message: "already claimed".into(),
            });
        };
        let cwd = PathBuf::from(&req.cwd);
        if let Err(e) = enter_dir(&cwd) {
            *pending = Some(p);
            return Err(ApiError::bad_request(format!(
                "cannot enter the working directory {}: {e}",
                cwd.display()
            )));
        }
        let answer = ClaimAnswer {
            user_data: file_id(sandbox_abi::layout::GUEST.user_data),
            skills: file_id(sandbox_abi::layout::GUEST.skills),
        };
        let mut exec = p.exec;
        exec.command_env = Some(env);
        let base = PathBase {
            cwd,
            home: p.base.home,
        };
        let routes = Routes {
            exec: Exec {
                config: exec,
                reaper: p.reaper,
                base: base.clone(),
            },
            editor: Editor::default(),
            base,
        };
        let _ = self.routes.set(Arc::new(routes));
        tracing::info!(cwd = %req.cwd, "claimed");
        Ok(answer)
    }
}

fn parse_env(entries: &[String]) -> Result<Vec<(OsString, OsString)>, ApiError> {
    entries
        .iter()
        .map(|e| match e.split_once('=') {
            Some((k, v)) if !k.is_empty() && !e.contains('\0') => {
                Ok((OsString::from(k), OsString::from(v)))
            }
            _ => Err(ApiError::bad_request(format!(
                "environment entry {e:?} is not KEY=VALUE"
            ))),
        })
        .collect()
}

/// Enters `dir`, resolved inside the root without following any symlink
/// (as the launcher enters a cold sandbox's workdir).
fn enter_dir(dir: &std::path::Path) -> std::io::Result<()> {
    use rustix::fs::{Mode, OFlags, ResolveFlags};
    let root = rustix::fs::open(
        "/",
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )?;
    let rel = dir.strip_prefix("/").unwrap_or(dir);
    let rel = if rel.as_os_str().is_empty() {
        std::path::Path::new(".")
    } else {
        rel
    };
    let fd = rustix::fs::openat2(
        &root,
        rel,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
        ResolveFlags::IN_ROOT | ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS,
    )?;
    rustix::process::fchdir(&fd)?;
    Ok(())
}

fn file_id(path: &str) -> Option<FileId> {
    let st = rustix::fs::stat(path).ok()?;
    Some(FileId {
        dev: st.st_dev,
        ino: st.st_ino,
    })
}
