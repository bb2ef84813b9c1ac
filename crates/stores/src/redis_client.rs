//! Connecting to Redis, for the replication store and for the sync collector's copy: the
//! URL (`redis://`, `rediss://` for TLS, or `redis+sentinel://` and `rediss+sentinel://`
//! for the master that Redis Sentinel names), the certificates a TLS connection trusts and shows ([`RedisTls`]), and
//! a failed connection's cause said with its fix ([`explain`]). A [`Connector`] asks the
//! sentinels again at each connection, so that a connection made again after a failover
//! reaches the promoted master.
//!
//! Must never: use TLS settings with a `redis://` URL (they would guard nothing: refused),
//! call a refused password or an untrusted certificate a server not running, or show a
//! URL's password.

use std::path::Path;
use std::time::Duration;

/// TLS to a Redis server (a `rediss://` URL): the certificate of the CA that signed the
/// server's (PEM; without it, the system's roots), and this side's certificate and key
/// (PEM) for a server that asks its clients for one (`tls-auth-clients yes`).
#[derive(Clone, Default)]
pub struct RedisTls {
    pub ca: Option<Vec<u8>>,
    /// The certificate (chain) and its key.
    pub identity: Option<(Vec<u8>, Vec<u8>)>,
}

/// The files of a [`RedisTls`], each with the name of the setting that gave it, so that an
/// error names the setting to fix (`replication.tls_ca`, `--redis-ca`).
#[derive(Clone, Copy, Default)]
pub struct TlsFiles<'a> {
    pub ca: Option<(&'a str, &'a Path)>,
    pub cert: Option<(&'a str, &'a Path)>,
    pub key: Option<(&'a str, &'a Path)>,
}

impl<'a> TlsFiles<'a> {
    /// The files of the command-line flags `--redis-ca`, `--redis-cert`, `--redis-key`.
    pub fn of_flags(
        ca: Option<&'a Path>,
        cert: Option<&'a Path>,
        key: Option<&'a Path>,
    ) -> TlsFiles<'a> {
        TlsFiles {
            ca: ca.map(|p| ("--redis-ca", p)),
            cert: cert.map(|p| ("--redis-cert", p)),
            key: key.map(|p| ("--redis-key", p)),
        }
    }

    /// The setting of the first file given, if any.
    pub fn first_given(&self) -> Option<&str> {
        [self.ca, self.cert, self.key]
            .into_iter()
            .flatten()
            .next()
            .map(|(setting, _)| setting)
    }
}

impl std::fmt::Debug for RedisTls {
    /// Which parts are set, never their bytes (a key is a secret).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RedisTls")
            .field("ca", &self.ca.is_some())
            .field("identity", &self.identity.is_some())
            .finish()
    }
}

impl RedisTls {
    /// Reads the files for a connection to `url` (`url_setting` names where the URL was
    /// given): `None` when no file is given. Refused: a file with a `redis://` URL, a
    /// certificate without its key or a key without its certificate, a file that cannot
    /// be read or holds no PEM block.
    pub fn load(url: &str, url_setting: &str, files: TlsFiles) -> Result<Option<RedisTls>, String> {
        let Some(first) = files.first_given() else {
            return Ok(None);
        };
        if !url.starts_with("rediss") {
            return Err(format!(
                "{first}: {url_setting} '{}' does not use TLS, so this would guard nothing: \
                 give a rediss:// URL (the server's tls-port; rediss+sentinel:// through \
                 Sentinel), or leave {first} out",
                redacted(url)
            ));
        }
        let read = |(setting, path): (&str, &Path)| -> Result<Vec<u8>, String> {
            let bytes =
                std::fs::read(path).map_err(|e| format!("{setting}: {}: {e}", path.display()))?;
            if !String::from_utf8_lossy(&bytes).contains("-----BEGIN ") {
                return Err(format!(
                    "{setting}: {} holds no PEM block (-----BEGIN ...): give the file in PEM form",
                    path.display()
                ));
            }
            Ok(bytes)
        };
        let identity = match (files.cert, files.key) {
            (Some(cert), Some(key)) => Some((read(cert)?, read(key)?)),
            (None, None) => None,
            (Some((cert, _)), None) => {
                return Err(format!(
                    "{cert}: a client certificate needs its key: give the key file too"
                ));
            }
            (None, Some((key, _))) => {
                return Err(format!(
                    "{key}: a client key needs its certificate: give the certificate file too"
                ));
            }
        };
        Ok(Some(RedisTls {
            ca: files.ca.map(read).transpose()?,
            identity,
        }))
    }

    /// As [`RedisTls::load`], for a URL that may not be given: files without one are
    /// refused.
    pub fn load_for(
        url: Option<&str>,
        url_setting: &str,
        files: TlsFiles,
    ) -> Result<Option<RedisTls>, String> {
        match (url, files.first_given()) {
            (Some(url), _) => RedisTls::load(url, url_setting, files),
            (None, Some(setting)) => Err(format!(
                "{setting}: it is for the connection to {url_setting}; give {url_setting} \
                 rediss://..., or leave {setting} out"
            )),
            (None, None) => Ok(None),
        }
    }

    fn certificates(&self) -> redis::TlsCertificates {
        redis::TlsCertificates {
            client_tls: (self.identity.clone()).map(|(client_cert, client_key)| {
                redis::ClientTlsConfig {
                    client_cert,
                    client_key,
                }
            }),
            root_cert: self.ca.clone(),
        }
    }
}

/// A client of the server at `url`, with `tls`'s certificates when given (a `rediss://`
/// URL without them trusts the system's roots).
pub fn client(url: &str, tls: Option<&RedisTls>) -> redis::RedisResult<redis::Client> {
    match tls {
        Some(tls) => redis::Client::build_with_tls(url, tls.certificates()),
        None => redis::Client::open(url),
    }
}

/// A client of the Redis Cluster whose nodes `urls` name (it asks each in turn for the
/// cluster's slots, so one node up is enough), as [`client`].
pub fn cluster_client(
    urls: &[String],
    tls: Option<&RedisTls>,
    connect_timeout: std::time::Duration,
    response_timeout: std::time::Duration,
) -> redis::RedisResult<redis::cluster::ClusterClient> {
    let mut builder = redis::cluster::ClusterClient::builder(urls.to_vec())
        .connection_timeout(connect_timeout)
        .response_timeout(response_timeout);
    if let Some(tls) = tls {
        builder = builder.certs(tls.certificates());
    }
    builder.build()
}

/// Refuses a server that may evict keys to make room (a `maxmemory` with a policy other
/// than `noeviction`): an evicted key is state the store acknowledged and then lost,
/// without a word (the volatile policies too: records carry an expiry). `for_what` says
/// what would be lost. A server that does not let its `INFO` be read is taken as it is,
/// and the log says the check was not made.
pub fn check_keeps_keys(
    conn: &mut impl redis::ConnectionLike,
    url: &str,
    for_what: &str,
) -> Result<(), String> {
    let texts = match info_texts(conn, "memory") {
        Ok(texts) => texts,
        Err(e) => {
            log::warn!(
                "{}: its eviction policy could not be read ({e}); make sure it is \
                 maxmemory-policy noeviction, or {for_what} can be lost",
                redacted(url)
            );
            return Ok(());
        }
    };
    for text in texts {
        let field = |name: &str| {
            (text.lines())
                .find_map(|l| l.strip_prefix(name))
                .map(str::trim)
        };
        let limit: u64 = field("maxmemory:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let policy = field("maxmemory_policy:").unwrap_or("noeviction");
        if limit > 0 && policy != "noeviction" {
            return Err(format!(
                "{}: the server evicts keys when it reaches its maxmemory ({limit} bytes, \
                 maxmemory-policy {policy}), and {for_what} would be lost with them; set \
                 maxmemory-policy noeviction (CONFIG SET maxmemory-policy noeviction, and in \
                 redis.conf), or maxmemory 0",
                redacted(url)
            ));
        }
    }
    Ok(())
}

/// Refuses a node of a Redis Cluster reached as one server (`fix` says how to reach it as
/// a cluster, or that it cannot be): its keys are spread over the cluster's nodes, and
/// each one elsewhere would be refused with a redirection, at every write. A server whose
/// `INFO` cannot be read is taken as it is.
pub fn check_not_cluster(
    conn: &mut impl redis::ConnectionLike,
    url: &str,
    fix: &str,
) -> Result<(), String> {
    let Ok(texts) = info_texts(conn, "cluster") else {
        return Ok(());
    };
    match texts.iter().any(|t| t.contains("cluster_enabled:1")) {
        true => Err(format!(
            "{}: the server is a node of a Redis Cluster; {fix}",
            redacted(url)
        )),
        false => Ok(()),
    }
}

/// What a store asked to `WAIT` for `wanted` replicas is told when a master has fewer
/// connected (`INFO replication`'s `connected_slaves`; each master of a cluster): every
/// write is held back until it has them, and its packets are dropped after their wait.
/// `None` when every master has them, or when `INFO` cannot be read. Replicas may still be
/// connecting, so this is said, not refused.
pub fn short_of_replicas(
    conn: &mut impl redis::ConnectionLike,
    url: &str,
    wanted: u32,
) -> Option<String> {
    let fewest = fewest_replicas(&info_texts(conn, "replication").ok()?)?;
    (fewest < wanted).then(|| {
        format!(
            "{}: {fewest} replica(s) connected where wait_replicas asks for {wanted}; writes \
             are held back until that many have them, and packets waiting on them are dropped \
             as unreplicated after park_timeout_ms: connect the replicas (replicaof), or lower \
             replication.wait_replicas",
            redacted(url)
        )
    })
}

/// The fewest `connected_slaves` of the `INFO replication` texts (one a master).
fn fewest_replicas(texts: &[String]) -> Option<u32> {
    (texts.iter())
        .filter_map(|text| {
            (text.lines())
                .find_map(|l| l.strip_prefix("connected_slaves:"))
                .and_then(|v| v.trim().parse().ok())
        })
        .min()
}

/// The text of `INFO section`: one server's, or a cluster's, one for each master.
fn info_texts(
    conn: &mut impl redis::ConnectionLike,
    section: &str,
) -> redis::RedisResult<Vec<String>> {
    let info = redis::cmd("INFO")
        .arg(section)
        .query::<redis::Value>(conn)?;
    Ok(match &info {
        redis::Value::Map(nodes) => nodes.iter().map(|(_, v)| info_text(v)).collect(),
        one => vec![info_text(one)],
    })
}

/// An `INFO` answer's text.
fn info_text(value: &redis::Value) -> String {
    match value {
        redis::Value::BulkString(b) => String::from_utf8_lossy(b).into_owned(),
        redis::Value::VerbatimString { text, .. } | redis::Value::SimpleString(text) => {
            text.clone()
        }
        _ => String::new(),
    }
}

/// `url`'s scheme, user information (with its `@`, or empty), host and port, and path.
fn url_parts(url: &str) -> Option<(&str, &str, &str, &str)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority_end = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(authority_end);
    let at = authority.rfind('@').map_or(0, |at| at + 1);
    Some((scheme, &authority[..at], &authority[at..], path))
}

/// `url` with its host and port replaced by `host` and `port` (its scheme, credentials and
/// database kept): another node of the same cluster. `None` if `url` is not a URL.
pub fn at_address(url: &str, host: &str, port: u16) -> Option<String> {
    let (scheme, userinfo, _, path) = url_parts(url)?;
    let host = match host.contains(':') {
        true => format!("[{host}]"),
        false => host.to_string(),
    };
    Some(format!("{scheme}://{userinfo}{host}:{port}{path}"))
}

/// What connections are made to: one server (`redis://`, `rediss://`), or the master that
/// Redis Sentinel names now (`redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/
/// MASTER`: the sentinels, and the master's name at them; the credentials are the
/// master's, and a sentinel's if it asks for a password; `rediss+sentinel://` reaches both
/// over TLS).
#[derive(Clone)]
pub struct Connector {
    url: String,
    tls: Option<RedisTls>,
    sentinel: Option<SentinelTarget>,
    /// The setting that gives the CA, named when the server's certificate is not trusted.
    ca_setting: &'static str,
}

#[derive(Clone)]
struct SentinelTarget {
    /// `redis://HOST:PORT/` (`rediss://` with TLS), one a sentinel.
    sentinels: Vec<String>,
    /// The scheme of the sentinels' and the master's URLs.
    scheme: &'static str,
    master: String,
    /// The master's `USER:PASSWORD` as the URL has it (percent-encoded).
    userinfo: Option<String>,
}

/// The schemes of a store named through Redis Sentinel, without TLS and with it (to the
/// sentinels and to the master alike, with the same certificates).
pub const SENTINEL_SCHEME: &str = "redis+sentinel://";
pub const SENTINEL_TLS_SCHEME: &str = "rediss+sentinel://";

impl Connector {
    /// Connections to `url` with `tls`'s certificates; a `redis+sentinel://` URL that
    /// names no sentinel or no master is refused.
    pub fn new(
        url: &str,
        tls: Option<RedisTls>,
        ca_setting: &'static str,
    ) -> Result<Connector, String> {
        let sentinel = (url.strip_prefix(SENTINEL_SCHEME).map(|rest| (rest, false)))
            .or_else(|| (url.strip_prefix(SENTINEL_TLS_SCHEME)).map(|rest| (rest, true)))
            .map(|(rest, tls_scheme)| SentinelTarget::parse(rest, tls_scheme))
            .transpose()
            .map_err(|why| {
                format!(
                    "{}: {why}; write redis+sentinel://[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER \
                     (rediss+sentinel:// for TLS to the sentinels and the master)",
                    redacted(url)
                )
            })?;
        Ok(Connector {
            url: url.to_string(),
            tls,
            sentinel,
            ca_setting,
        })
    }

    /// A connection, made within `timeout` (the sentinels asked first, each time), or what
    /// went wrong with its fix.
    pub fn connect(&self, timeout: Duration) -> Result<redis::Connection, String> {
        let explain = |e: redis::RedisError| explain(&self.url, &e, self.ca_setting);
        match &self.sentinel {
            Some(sentinel) => {
                (sentinel.master_connection(self.tls.as_ref(), timeout)).map_err(explain)
            }
            None => (client(&self.url, self.tls.as_ref()))
                .and_then(|c| c.get_connection_with_timeout(timeout))
                .map_err(explain),
        }
    }
}

impl SentinelTarget {
    /// What follows the scheme: `[USER:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER`.
    fn parse(rest: &str, tls: bool) -> Result<SentinelTarget, String> {
        let scheme = if tls { "rediss" } else { "redis" };
        let (authority, master) = rest
            .split_once('/')
            .ok_or("no master's name after the sentinels")?;
        let master = master.trim_end_matches('/');
        if master.is_empty() || master.contains('/') {
            return Err(format!("'{master}' is not a master's name"));
        }
        let (userinfo, hosts) = match authority.rsplit_once('@') {
            Some((userinfo, hosts)) => (Some(userinfo), hosts),
            None => (None, authority),
        };
        if userinfo.is_some_and(|u| !u.contains(':')) {
            return Err("a user with no password".into());
        }
        let sentinels: Vec<String> = hosts
            .split(',')
            .map(|host| match host.rsplit_once(':') {
                Some((name, port)) if !name.is_empty() && port.parse::<u16>().is_ok() => {
                    Ok(format!("{scheme}://{host}/"))
                }
                _ => Err(format!("'{host}' is not a sentinel's HOST:PORT")),
            })
            .collect::<Result<_, _>>()?;
        Ok(SentinelTarget {
            sentinels,
            scheme,
            master: master.to_string(),
            userinfo: userinfo.map(str::to_string),
        })
    }

    /// A connection to the master the sentinels name now, each asked in turn, each step
    /// within `timeout`; the server named must say it is the master (`ROLE`), so that no
    /// connection is made to one a failover has demoted or not yet promoted.
    fn master_connection(
        &self,
        tls: Option<&RedisTls>,
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        let mut last = None;
        for sentinel in &self.sentinels {
            match self.master_named_by(sentinel, tls, timeout) {
                Ok(conn) => return Ok(conn),
                Err(e) => last = Some(e),
            }
        }
        Err(last
            .unwrap_or_else(|| (redis::ErrorKind::EmptySentinelList, "no sentinel named").into()))
    }

    /// The master's address `sentinel` gives, asked with `userinfo`'s credentials if any.
    fn ask_sentinel(
        &self,
        sentinel: &str,
        userinfo: Option<&str>,
        tls: Option<&RedisTls>,
        timeout: Duration,
    ) -> redis::RedisResult<Option<(String, u16)>> {
        let url = match userinfo {
            Some(userinfo) => sentinel.replacen("://", &format!("://{userinfo}@"), 1),
            None => sentinel.to_string(),
        };
        let mut asked = client(&url, tls)?.get_connection_with_timeout(timeout)?;
        asked.set_read_timeout(Some(timeout))?;
        redis::cmd("SENTINEL")
            .arg("get-master-addr-by-name")
            .arg(&self.master)
            .query(&mut asked)
    }

    fn master_named_by(
        &self,
        sentinel: &str,
        tls: Option<&RedisTls>,
        timeout: Duration,
    ) -> redis::RedisResult<redis::Connection> {
        let named = match self.ask_sentinel(sentinel, None, tls, timeout) {
            // A sentinel that asks for a password is given the URL's (the common set-up:
            // one password for the sentinels and the master they watch).
            Err(e) if e.code() == Some("NOAUTH") && self.userinfo.is_some() => {
                self.ask_sentinel(sentinel, self.userinfo.as_deref(), tls, timeout)?
            }
            named => named?,
        };
        let Some((host, port)) = named else {
            return Err((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the sentinel knows no master of that name",
            )
                .into());
        };
        let host = match host.contains(':') {
            true => format!("[{host}]"),
            false => host,
        };
        let credentials = (self.userinfo.as_deref()).map_or(String::new(), |u| format!("{u}@"));
        let unreachable = |e: redis::RedisError| {
            let why = match e.is_timeout() {
                true => "the master the sentinel names gives no answer in time",
                false => "the master the sentinel names cannot be reached",
            };
            match e.is_io_error() {
                true => redis::RedisError::from((
                    redis::ErrorKind::Client,
                    why,
                    format!("{host}:{port}: {e}"),
                )),
                false => e,
            }
        };
        let scheme = self.scheme;
        let mut master = client(&format!("{scheme}://{credentials}{host}:{port}/"), tls)?
            .get_connection_with_timeout(timeout)
            .map_err(unreachable)?;
        master.set_read_timeout(Some(timeout))?;
        let role: redis::Value = redis::cmd("ROLE").query(&mut master)?;
        let first = match &role {
            redis::Value::Array(items) => items.first(),
            _ => None,
        };
        let is_master = match first {
            Some(redis::Value::BulkString(b)) => b == b"master",
            Some(redis::Value::SimpleString(s)) => s == "master",
            _ => false,
        };
        if !is_master {
            return Err((
                redis::ErrorKind::MasterNameNotFoundBySentinel,
                "the server the sentinel names is not a master",
            )
                .into());
        }
        master.set_read_timeout(None)?;
        Ok(master)
    }
}

/// `url` as it may be shown (errors, logs, a run's summary): its password, if it has one,
/// as `***`.
pub fn redacted(url: &str) -> String {
    match url_parts(url) {
        Some((scheme, userinfo, host, path)) if !userinfo.is_empty() => {
            let userinfo = &userinfo[..userinfo.len() - 1];
            let shown = match userinfo.split_once(':') {
                Some((user, _)) => format!("{user}:***"),
                None => userinfo.to_string(),
            };
            format!("{scheme}://{shown}@{host}{path}")
        }
        _ => url.to_string(),
    }
}

/// What to do about a failed connection to `url` or a command refused on it: the error
/// followed by its likely cause and fix. `ca_setting` names the setting that gives the CA
/// (`replication.tls_ca`, `--redis-ca`).
pub fn explain(url: &str, e: &redis::RedisError, ca_setting: &str) -> String {
    explain_or(url, e, ca_setting, None)
}

/// As [`explain`], with `otherwise` as the cause when the error shows none of those known.
pub fn explain_or(
    url: &str,
    e: &redis::RedisError,
    ca_setting: &str,
    otherwise: Option<&str>,
) -> String {
    let url = redacted(url);
    let text = e.to_string();
    let lower = text.to_lowercase();
    let tls = url.starts_with("rediss");
    let hint = if e.kind() == redis::ErrorKind::AuthenticationFailed
        || lower.contains("wrongpass")
        || lower.contains("invalid username-password")
    {
        "the server refused the password: give the one it has in the URL, \
         redis://:PASSWORD@HOST:PORT/ (with an ACL user, redis://USER:PASSWORD@HOST:PORT/)"
            .to_string()
    } else if lower.contains("noauth") {
        "the server asks for a password: give it in the URL, redis://:PASSWORD@HOST:PORT/ \
         (with an ACL user, redis://USER:PASSWORD@HOST:PORT/)"
            .to_string()
    } else if lower.contains("readonly") && lower.contains("replica") {
        "the server is a replica, which takes no writes: name its master, or the sentinels \
         that watch it (redis+sentinel://HOST:PORT/MASTER)"
            .to_string()
    } else if tls && lower.contains("unable to build client with tls") {
        "this side's certificate or key cannot be used: give an X.509 v3 certificate (PEM) \
         and its private key (PEM)"
            .to_string()
    } else if tls && (lower.contains("unknownca") || lower.contains("badcertificate")) {
        "the server does not trust this side's certificate: give one signed by a CA of the \
         server's tls-ca-cert-file"
            .to_string()
    } else if tls
        && (lower.contains("unknownissuer")
            || lower.contains("unknown issuer")
            || lower.contains("invalid peer certificate"))
    {
        format!(
            "the server's certificate is not one this side trusts: give the certificate of \
             the CA that signed it (PEM) as {ca_setting}"
        )
    } else if tls
        && (lower.contains("certificate required")
            || lower.contains("handshake")
            || lower.contains("alert"))
    {
        "the TLS handshake failed: if the server asks clients for a certificate \
         (tls-auth-clients), give this side's certificate and key"
            .to_string()
    } else if tls && (lower.contains("corrupt message") || lower.contains("invalid content type")) {
        "the server does not speak TLS on that port: give its tls-port, or a redis:// URL \
         for a port without TLS"
            .to_string()
    } else if e.kind() == redis::ErrorKind::MasterNameNotFoundBySentinel {
        "the sentinels name no master of that name that is up: check the name after the \
         last / (SENTINEL MASTERS lists them), or wait for their failover to end"
            .to_string()
    } else if e.is_connection_refusal() && url.contains("+sentinel://") {
        "is redis-sentinel running at those addresses?".to_string()
    } else if e.is_connection_refusal() {
        "is redis-server running there?".to_string()
    } else if !tls && (e.is_connection_dropped() || lower.contains("connection reset")) {
        "the server closed the connection: if that port is its tls-port, give a rediss:// URL"
            .to_string()
    } else if tls && e.is_timeout() {
        "no TLS answer in time: is that port the server's tls-port? (a port without TLS waits \
         for a command)"
            .to_string()
    } else if e.is_timeout() {
        "no answer in time: is the address right, and is the server reachable from here?"
            .to_string()
    } else if let Some(otherwise) = otherwise {
        otherwise.to_string()
    } else {
        return format!("{url}: {text}");
    };
    format!("{url}: {text} ({hint})")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_fewest_replicas_are_those_of_the_master_with_fewest() {
        let text = |n: &str| format!("# Replication\r\nrole:master\r\nconnected_slaves:{n}\r\n");
        assert_eq!(fewest_replicas(&[text("2"), text("0"), text("1")]), Some(0));
        assert_eq!(fewest_replicas(&[text("3")]), Some(3));
        // A text with no count (or not a number) says nothing; none at all: not known.
        assert_eq!(fewest_replicas(&[text("x"), text("1")]), Some(1));
        assert_eq!(fewest_replicas(&["role:master".to_string()]), None);
        assert_eq!(fewest_replicas(&[]), None);
    }

    #[test]
    fn a_shown_url_never_has_its_password() {
        for (url, shown) in [
            ("redis://127.0.0.1:6379/", "redis://127.0.0.1:6379/"),
            (
                "redis://:secret@127.0.0.1:6379/",
                "redis://:***@127.0.0.1:6379/",
            ),
            (
                "rediss://app:s3:cr@t@host:6380/0",
                "rediss://app:***@host:6380/0",
            ),
            ("redis://app@host", "redis://app@host"),
            (
                "redis+sentinel://:pw@127.0.0.1:26379,127.0.0.1:26380/mymaster",
                "redis+sentinel://:***@127.0.0.1:26379,127.0.0.1:26380/mymaster",
            ),
            ("memory", "memory"),
        ] {
            assert_eq!(redacted(url), shown, "{url}");
        }
    }

    #[test]
    fn another_node_of_a_cluster_is_named_with_the_urls_scheme_credentials_and_path() {
        for (url, host, port, other) in [
            (
                "redis://127.0.0.1:7000/",
                "127.0.0.1",
                7001,
                "redis://127.0.0.1:7001/",
            ),
            (
                "rediss://app:s3:cr@t@h:7000/0",
                "10.0.0.2",
                7002,
                "rediss://app:s3:cr@t@10.0.0.2:7002/0",
            ),
            ("redis://h:7000", "::1", 7003, "redis://[::1]:7003"),
        ] {
            assert_eq!(at_address(url, host, port).as_deref(), Some(other), "{url}");
        }
        assert_eq!(at_address("memory", "h", 1), None);
    }

    #[test]
    fn a_sentinel_url_names_its_sentinels_master_and_credentials() {
        let c = Connector::new(
            "redis+sentinel://app:pw@127.0.0.1:26379,localhost:26380/mymaster",
            None,
            "x",
        )
        .unwrap();
        let s = c.sentinel.unwrap();
        assert_eq!(
            s.sentinels,
            ["redis://127.0.0.1:26379/", "redis://localhost:26380/"]
        );
        assert_eq!(s.master, "mymaster");
        assert_eq!(s.userinfo.as_deref(), Some("app:pw"));
        let s = (Connector::new("redis+sentinel://:p%40w@h:1/m/", None, "x")
            .unwrap()
            .sentinel)
            .unwrap();
        assert_eq!(
            (s.userinfo.as_deref(), s.master.as_str()),
            (Some(":p%40w"), "m")
        );
        for (url, why) in [
            ("redis+sentinel://h:26379", "no master's name"),
            ("redis+sentinel://h:26379/", "'' is not a master's name"),
            ("redis+sentinel://h/m", "'h' is not a sentinel's HOST:PORT"),
            (
                "redis+sentinel://h:1,:2/m",
                "':2' is not a sentinel's HOST:PORT",
            ),
            ("redis+sentinel://user@h:1/m", "a user with no password"),
            ("rediss+sentinel://h:1", "no master's name"),
        ] {
            let err = Connector::new(url, None, "x").err().unwrap();
            assert!(err.contains(why), "{url}: {err}");
        }
        let ca = TlsFiles {
            ca: Some(("x", Path::new("/nowhere.pem"))),
            ..TlsFiles::default()
        };
        let err = RedisTls::load("redis://:secret@h:1/", "store", ca).unwrap_err();
        assert!(
            err.contains("does not use TLS") && !err.contains("secret"),
            "{err}"
        );
        let err = Connector::new("redis+sentinel://:secret@h:1", None, "x")
            .err()
            .unwrap();
        assert!(!err.contains("secret"), "{err}");
        let s = (Connector::new("rediss+sentinel://h:1,h:2/m", None, "x")
            .unwrap()
            .sentinel)
            .unwrap();
        assert_eq!(s.sentinels, ["rediss://h:1/", "rediss://h:2/"]);
        assert!((Connector::new("redis://h:1/", None, "x").unwrap().sentinel).is_none());
    }
}
