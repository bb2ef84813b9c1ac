//! Where the APIs listen and who may talk to them.
//!
//! Owns: the forms users give an endpoint in (`unix:PATH` or a path, `HOST:PORT`,
//! `https://HOST:PORT`), the run directory that holds the default Unix socket, the guard of
//! a TCP endpoint (TLS with rustls, and a bearer token or client certificates), and the
//! client's side of each (its channel and the token it sends).
//!
//! Invariants: a Unix socket is created mode 0600 (bound under a temporary name, its mode
//! set, then renamed into place, so it is never reachable with a wider mode); TCP without
//! TLS is loopback only; TCP beyond loopback needs TLS and a token or client certificates.
//!
//! Must never: remove a file that is not a socket nobody listens on, or compare a token in
//! time that depends on where it differs.

use std::net::SocketAddr;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Identity, ServerTlsConfig};
use tonic::{Request, Status};

/// The environment variable that moves the run directory (the lab gives each switch its own).
pub const RUN_DIR_VAR: &str = "STATEPLANE_RUN_DIR";

/// The default control socket's name in the run directory.
pub const SOCKET_NAME: &str = "control.sock";

/// Tokens shorter than this are refused: a guess must not be practical.
pub const TOKEN_MIN: usize = 16;

/// Where a run keeps its control socket: `$STATEPLANE_RUN_DIR`, else `/run/stateplane` for
/// root, `$XDG_RUNTIME_DIR/stateplane` for other users, or `/tmp/stateplane-UID`.
pub fn run_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os(RUN_DIR_VAR) {
        return PathBuf::from(dir);
    }
    match current_uid() {
        Some(0) => PathBuf::from("/run/stateplane"),
        uid => match std::env::var_os("XDG_RUNTIME_DIR") {
            Some(dir) => PathBuf::from(dir).join("stateplane"),
            None => std::env::temp_dir().join(format!("stateplane-{}", uid.unwrap_or(0))),
        },
    }
}

/// The control API's endpoint when none is given: a Unix socket in the run directory.
pub fn default_socket() -> PathBuf {
    run_dir().join(SOCKET_NAME)
}

/// This process's user id (the owner of its `/proc` entry).
fn current_uid() -> Option<u32> {
    std::fs::metadata("/proc/self").ok().map(|m| m.uid())
}

/// The files that guard a TCP endpoint, as a run's settings name them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct GuardFiles {
    /// The server's certificate chain (PEM).
    pub cert: Option<PathBuf>,
    /// The server's private key (PEM).
    pub key: Option<PathBuf>,
    /// Clients must present a certificate signed by this CA (PEM).
    pub client_ca: Option<PathBuf>,
    /// Clients must send the token this file holds.
    pub token_file: Option<PathBuf>,
}

impl GuardFiles {
    fn any(&self) -> bool {
        *self != GuardFiles::default()
    }
}

/// Where a server listens.
#[derive(Clone)]
pub enum Listen {
    Unix(PathBuf),
    Tcp {
        addr: SocketAddr,
        guard: Option<Guard>,
    },
}

impl std::fmt::Display for Listen {
    /// As `stateplane ctl --server` takes it.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(path) => write!(f, "unix:{}", path.display()),
            Listen::Tcp { addr, guard: None } => write!(f, "{addr}"),
            Listen::Tcp {
                addr,
                guard: Some(_),
            } => write!(f, "https://{addr}"),
        }
    }
}

/// How a TCP endpoint is guarded: TLS, and who may call.
#[derive(Clone)]
pub struct Guard {
    tls: ServerTlsConfig,
    token: CheckToken,
    client_certs: bool,
}

impl Guard {
    pub fn tls(&self) -> ServerTlsConfig {
        self.tls.clone()
    }

    /// What every call passes through: the token check (a no-op without a token).
    pub fn check_token(&self) -> CheckToken {
        self.token.clone()
    }
}

impl Listen {
    /// Loopback TCP on `port` (0: any free port), unguarded.
    pub fn loopback(port: u16) -> Listen {
        Listen::Tcp {
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            guard: None,
        }
    }

    /// An endpoint as a user gives it (`unix:PATH` or a path with a `/`, or `HOST:PORT`),
    /// guarded by `files`. The messages name `--control` and its companions, the settings
    /// of `stateplane run` (the config keys are the same with underscores).
    pub fn parse(text: &str, files: &GuardFiles) -> Result<Listen, String> {
        if let Some(path) = unix_path(text) {
            if files.any() {
                return Err(format!(
                    "--control-cert, --control-key, --control-client-ca and --control-token-file \
                     guard a TCP endpoint; {text} is a Unix socket, which its file mode guards \
                     (0600: this user only)"
                ));
            }
            return Ok(Listen::Unix(path));
        }
        let addr: SocketAddr = text.parse().map_err(|_| {
            format!(
                "'{text}' is neither HOST:PORT (an IP address and port, e.g. 127.0.0.1:9559) \
                 nor a Unix socket (unix:PATH, or a path with a '/'), nor 'off'"
            )
        })?;
        let guard = Guard::load(files, &addr)?;
        if guard.is_none() && !addr.ip().is_loopback() {
            return Err(format!(
                "listening on {addr}, beyond loopback, needs TLS and a way to tell clients \
                 apart: give --control-cert FILE and --control-key FILE, and \
                 --control-token-file FILE or --control-client-ca FILE (or listen on \
                 127.0.0.1:{} or a Unix socket)",
                addr.port()
            ));
        }
        Ok(Listen::Tcp { addr, guard })
    }
}

/// The path of a Unix socket endpoint: `unix:PATH`, or text with a `/` and no port.
fn unix_path(text: &str) -> Option<PathBuf> {
    if let Some(path) = text.strip_prefix("unix:") {
        return Some(PathBuf::from(path));
    }
    (text.contains('/') && !text.contains("://")).then(|| PathBuf::from(text))
}

fn read_pem(flag: &str, path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    if !bytes.windows(11).any(|w| w == b"-----BEGIN ") {
        return Err(format!(
            "{flag} {}: not PEM (no '-----BEGIN' line); give a PEM file",
            path.display()
        ));
    }
    Ok(bytes)
}

/// A token file's token (its text, trimmed).
pub fn read_token(flag: &str, path: &Path) -> Result<String, String> {
    let text =
        std::fs::read_to_string(path).map_err(|e| format!("{flag} {}: {e}", path.display()))?;
    let token = text.trim();
    if token.len() < TOKEN_MIN || !token.bytes().all(|b| b.is_ascii_graphic()) {
        return Err(format!(
            "{flag} {}: a token is at least {TOKEN_MIN} printable characters without spaces \
             (e.g. `head -c 24 /dev/urandom | base64 > FILE`)",
            path.display()
        ));
    }
    Ok(token.to_string())
}

impl Guard {
    /// The guard `files` describe for a server on `addr`; `None` when they name nothing.
    fn load(files: &GuardFiles, addr: &SocketAddr) -> Result<Option<Guard>, String> {
        if !files.any() {
            return Ok(None);
        }
        let (Some(cert), Some(key)) = (&files.cert, &files.key) else {
            return Err(format!(
                "TLS on {addr} needs both --control-cert FILE (the server's certificate \
                 chain) and --control-key FILE (its private key)"
            ));
        };
        if files.client_ca.is_none() && files.token_file.is_none() {
            return Err(format!(
                "TLS on {addr} keeps the traffic secret but lets anyone in: give \
                 --control-token-file FILE (clients send the token) or --control-client-ca \
                 FILE (clients present a certificate it signed), or both"
            ));
        }
        let identity = Identity::from_pem(
            read_pem("--control-cert", cert)?,
            read_pem("--control-key", key)?,
        );
        let mut tls = ServerTlsConfig::new()
            .identity(identity)
            .timeout(Duration::from_secs(5));
        if let Some(ca) = &files.client_ca {
            tls = tls.client_ca_root(Certificate::from_pem(read_pem("--control-client-ca", ca)?));
        }
        let token = match &files.token_file {
            Some(path) => Some(read_token("--control-token-file", path)?),
            None => None,
        };
        Ok(Some(Guard {
            tls,
            token: CheckToken(token.map(|t| Arc::from(t.into_bytes()))),
            client_certs: files.client_ca.is_some(),
        }))
    }

    /// Whether clients present certificates (for the log's account of who called).
    pub fn client_certs(&self) -> bool {
        self.client_certs
    }
}

/// Marks a call that carried the right token (for the log's account of who called).
#[derive(Clone, Copy, Debug)]
pub struct HadToken;

/// The server's token check: refuses a call without the token, or with another.
#[derive(Clone, Default)]
pub struct CheckToken(Option<Arc<[u8]>>);

impl tonic::service::Interceptor for CheckToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        let Some(token) = &self.0 else {
            return Ok(request);
        };
        let given = (request.metadata().get("authorization"))
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.strip_prefix("Bearer "));
        let refused = match given {
            Some(given) if same_bytes(given.as_bytes(), token) => {
                request.extensions_mut().insert(HadToken);
                return Ok(request);
            }
            Some(_) => "the token is not the switch's",
            None => "the call carries no token",
        };
        log::warn!(
            "control API: a call by {} refused: {refused}",
            client_of(&request)
        );
        Err(Status::unauthenticated(format!(
            "{refused}; give the token the switch's --control-token-file holds with \
             `stateplane ctl --token-file FILE`"
        )))
    }
}

/// Whether `a` and `b` are equal, in time that depends only on their lengths.
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |d, (x, y)| d | (x ^ y)) == 0
}

/// Who made a call, as the log says it: the user and process over a Unix socket, or the
/// address and port over TCP, with how they proved themselves.
pub fn client_of<T>(request: &Request<T>) -> String {
    use tonic::transport::server::UdsConnectInfo;
    if let Some(uds) = request.extensions().get::<UdsConnectInfo>() {
        return match uds.peer_cred {
            Some(c) => match c.pid() {
                Some(pid) => format!("uid {} (pid {pid}) on the Unix socket", c.uid()),
                None => format!("uid {} on the Unix socket", c.uid()),
            },
            None => "a client on the Unix socket".to_string(),
        };
    }
    let mut who = request
        .remote_addr()
        .map_or_else(|| "a client".to_string(), |a| a.to_string());
    if request.peer_certs().is_some_and(|c| !c.is_empty()) {
        who.push_str(" with a client certificate");
    }
    if request.extensions().get::<HadToken>().is_some() {
        who.push_str(" with the token");
    }
    who
}

/// Makes ready a Unix socket at `path`: its directory made (mode 0700) if missing, a stale
/// socket nobody listens on replaced; refused when a process listens there or the path is
/// something else. The listener is mode 0600 from the moment it can be reached.
pub fn bind_unix(path: &Path, what: &str) -> Result<std::os::unix::net::UnixListener, String> {
    let dir = path.parent().filter(|d| !d.as_os_str().is_empty());
    if let Some(dir) = dir {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(dir)
            .map_err(|e| format!("cannot make {} for the {what}'s socket: {e}", dir.display()))?;
        // A directory another user owns (a shared /tmp's, made first by someone else)
        // could let that user replace the socket.
        let owner = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if current_uid().is_some_and(|me| me != owner.uid()) {
            return Err(format!(
                "{} belongs to uid {}, not to this user: give the {what} a directory of \
                 your own (--control unix:PATH, or {RUN_DIR_VAR})",
                dir.display(),
                owner.uid()
            ));
        }
    }
    match std::fs::symlink_metadata(path) {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(format!("{}: {e}", path.display())),
        Ok(m) if !std::os::unix::fs::FileTypeExt::is_socket(&m.file_type()) => {
            return Err(format!(
                "{} exists and is not a socket; remove it, or give the {what} another path",
                path.display()
            ));
        }
        Ok(_) => match std::os::unix::net::UnixStream::connect(path) {
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                log::info!("{}: a stale socket, replaced", path.display());
            }
            Ok(_) => {
                return Err(format!(
                    "another process listens on {} (another switch's {what}?)",
                    path.display()
                ));
            }
            Err(e) => return Err(format!("{}: {e}", path.display())),
        },
    }
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(format!(".{}.new", std::process::id()));
    let temporary = PathBuf::from(temporary);
    let _ = std::fs::remove_file(&temporary);
    let listener = std::os::unix::net::UnixListener::bind(&temporary)
        .map_err(|e| format!("cannot listen for the {what} on {}: {e}", path.display()))?;
    let placed = std::fs::set_permissions(&temporary, std::fs::Permissions::from_mode(0o600))
        .and_then(|()| std::fs::rename(&temporary, path));
    if let Err(e) = placed {
        let _ = std::fs::remove_file(&temporary);
        return Err(format!(
            "cannot place the {what}'s socket at {}: {e}",
            path.display()
        ));
    }
    Ok(listener)
}

/// How a client reaches a server and proves itself.
#[derive(Debug, Clone, Default)]
pub struct ClientFiles {
    /// The CA (or the server's own certificate) that the server's certificate must chain to.
    pub ca: Option<PathBuf>,
    /// This client's certificate and key, for a server that asks for one.
    pub cert: Option<PathBuf>,
    pub key: Option<PathBuf>,
    /// The token to send.
    pub token_file: Option<PathBuf>,
}

/// Sends the token (when there is one) with every call.
#[derive(Clone, Default)]
pub struct AddToken(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for AddToken {
    fn call(&mut self, mut request: Request<()>) -> Result<Request<()>, Status> {
        if let Some(token) = &self.0 {
            request
                .metadata_mut()
                .insert("authorization", token.clone());
        }
        Ok(request)
    }
}

/// A channel to `server` (`unix:PATH` or a path, `HOST:PORT`, or `https://HOST:PORT`; TLS
/// also when `files` name a CA or a certificate), and what adds the token to each call.
/// `what` names the API in messages, `hint` says how to start its server.
pub async fn connect(
    server: &str,
    files: &ClientFiles,
    what: &str,
    hint: &str,
) -> Result<(Channel, AddToken), crate::client::ClientError> {
    use crate::client::ClientError;
    let local = |message: String| ClientError {
        code: tonic::Code::InvalidArgument,
        message,
    };
    let unreachable = |e: &dyn std::error::Error| ClientError {
        code: tonic::Code::Unavailable,
        message: format!(
            "cannot reach the {what} at {server}: {} ({hint})",
            deepest(e)
        ),
    };
    let token = match &files.token_file {
        Some(path) => {
            let token = read_token("--token-file", path).map_err(local)?;
            let value = format!("Bearer {token}").parse().map_err(|_| {
                local(format!(
                    "--token-file {}: not a valid header value",
                    path.display()
                ))
            })?;
            AddToken(Some(value))
        }
        None => AddToken(None),
    };
    let tuned = |endpoint: tonic::transport::Endpoint| {
        endpoint
            .connect_timeout(Duration::from_secs(3))
            .initial_stream_window_size(Some(crate::server::WINDOW))
            .initial_connection_window_size(Some(crate::server::WINDOW))
            .max_frame_size(crate::server::FRAME)
    };
    if let Some(path) = unix_path(server) {
        if files.ca.is_some() || files.cert.is_some() {
            return Err(local(format!(
                "{server} is a Unix socket: its file mode guards it, there is no TLS to \
                 configure (--ca, --cert and --key are for https://HOST:PORT)"
            )));
        }
        // The URI is not used: the connector opens the socket.
        let endpoint = tuned(tonic::transport::Endpoint::from_static("http://localhost"));
        let channel = endpoint
            .connect_with_connector(tower::service_fn(move |_: tonic::transport::Uri| {
                let path = path.clone();
                async move {
                    let stream = tokio::net::UnixStream::connect(path).await?;
                    Ok::<_, std::io::Error>(hyper_util::rt::TokioIo::new(stream))
                }
            }))
            .await
            .map_err(|e| unreachable(&e))?;
        return Ok((channel, token));
    }
    let (tls, host_port) = match server.strip_prefix("https://") {
        Some(rest) => (true, rest),
        None => (files.ca.is_some() || files.cert.is_some(), server),
    };
    let scheme = if tls { "https" } else { "http" };
    let endpoint = Channel::from_shared(format!("{scheme}://{host_port}")).map_err(|e| {
        local(format!(
            "'{server}' is not HOST:PORT, https://HOST:PORT or unix:PATH: {e}"
        ))
    })?;
    let mut endpoint = tuned(endpoint);
    if tls {
        let Some(ca) = &files.ca else {
            return Err(local(format!(
                "TLS to {server} needs --ca FILE: the CA (or the certificate itself) that \
                 the server's certificate is checked against"
            )));
        };
        let mut config = ClientTlsConfig::new()
            .ca_certificate(Certificate::from_pem(read_pem("--ca", ca).map_err(local)?));
        match (&files.cert, &files.key) {
            (Some(cert), Some(key)) => {
                config = config.identity(Identity::from_pem(
                    read_pem("--cert", cert).map_err(local)?,
                    read_pem("--key", key).map_err(local)?,
                ));
            }
            (None, None) => {}
            _ => return Err(local("--cert and --key go together".into())),
        }
        endpoint = endpoint
            .tls_config(config)
            .map_err(|e| local(format!("TLS to {server}: {}", deepest(&e))))?;
    } else if files.cert.is_some() || files.key.is_some() {
        return Err(local(
            "--cert and --key are for TLS (https://HOST:PORT)".into(),
        ));
    }
    let channel = endpoint.connect().await.map_err(|e| unreachable(&e))?;
    Ok((channel, token))
}

/// An error with its causes (tonic's transport errors say "transport error" on top and
/// the reason — a refused certificate, a missing socket — below).
fn deepest(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        // A wrapper often repeats its source's text: say it once.
        let said = c.to_string();
        if !text.ends_with(&said) {
            text.push_str(": ");
            text.push_str(&said);
        }
        cause = c.source();
    }
    text
}
