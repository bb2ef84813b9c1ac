//! The gRPC service, on a thread of its own with a small async runtime.

use crate::convert::{self, status};
use crate::endpoint::{self, CheckToken, Listen};
use crate::pb::{self, control_server};
use stateplane_runtime::{ControlPlane, Taken};
use stateplane_state::{ControlError, Declaration, FlowChange, Reply, Request};
use std::os::unix::fs::MetadataExt;
use std::path::PathBuf;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;
use tokio_stream::Stream;
use tonic::codegen::http;
use tonic::{Response, Status};

/// Reads the pipeline's counters (the data path's totals) when a client asks.
pub type PipelineCounters = Arc<dyn Fn() -> Vec<(String, u64)> + Send + Sync>;

/// Reloads the run's program from its configuration (it may block while the workers take
/// it): the generation they run, and what each worker's program kept; `Err` with why the
/// configuration was refused.
pub type Reloader = Arc<dyn Fn() -> Result<(u64, Vec<Taken>), String> + Send + Sync>;

pub struct ControlService {
    plane: Arc<ControlPlane>,
    program: String,
    pipeline: PipelineCounters,
    reloader: Option<Reloader>,
    requests: Arc<RequestCounts>,
}

/// The API's requests, by method, and those it refused (answered with an error status),
/// for the run's metrics.
#[derive(Debug, Default)]
pub struct RequestCounts {
    by_method: std::sync::Mutex<std::collections::BTreeMap<String, MethodCounts>>,
}

/// One method's requests and refusals.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct MethodCounts {
    pub requests: u64,
    pub refused: u64,
}

impl RequestCounts {
    /// Each method asked so far (by its gRPC name, e.g. `Write`), with its counts.
    pub fn by_method(&self) -> Vec<(String, MethodCounts)> {
        let counts = self.by_method.lock().unwrap_or_else(|e| e.into_inner());
        counts.iter().map(|(m, c)| (m.clone(), *c)).collect()
    }

    fn count(&self, method: &str, refused: bool) {
        let mut counts = self.by_method.lock().unwrap_or_else(|e| e.into_inner());
        let c = counts.entry(method.to_string()).or_default();
        c.requests += 1;
        c.refused += u64::from(refused);
    }
}

/// A gRPC service counted into [`RequestCounts`]: each call by its method's name, once
/// answered, as refused when the answer's headers carry an error status (a refusal of a
/// streaming call after its first message is counted as a request).
#[derive(Clone)]
struct Counted<S> {
    inner: S,
    counts: Arc<RequestCounts>,
}

impl<S: tonic::server::NamedService> tonic::server::NamedService for Counted<S> {
    const NAME: &'static str = S::NAME;
}

impl<S, B, R> tower::Service<http::Request<B>> for Counted<S>
where
    S: tower::Service<http::Request<B>, Response = http::Response<R>>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = Pin<Box<dyn std::future::Future<Output = Result<S::Response, S::Error>> + Send>>;

    fn poll_ready(
        &mut self,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, request: http::Request<B>) -> Self::Future {
        let path = request.uri().path();
        let method = path.rsplit('/').next().unwrap_or(path).to_string();
        let counts = self.counts.clone();
        let answer = self.inner.call(request);
        Box::pin(async move {
            let answer = answer.await;
            let refused = answer.as_ref().map_or(true, |r| {
                (r.headers().get("grpc-status")).is_some_and(|status| status.as_bytes() != b"0")
            });
            counts.count(&method, refused);
            answer
        })
    }
}

impl ControlService {
    pub fn new(plane: Arc<ControlPlane>, program: &str, pipeline: PipelineCounters) -> Self {
        ControlService {
            plane,
            program: program.to_string(),
            pipeline,
            reloader: None,
            requests: Arc::default(),
        }
    }

    /// What counts the requests this service is asked (see [`RequestCounts`]).
    pub fn requests(&self) -> Arc<RequestCounts> {
        self.requests.clone()
    }

    /// A service whose `Reload` calls `reloader` (a live switch's).
    pub fn with_reloader(self, reloader: Reloader) -> Self {
        ControlService {
            reloader: Some(reloader),
            ..self
        }
    }

    fn declaration(&self, name: &str) -> Result<Declaration, Status> {
        stateplane_state::control::find(&self.plane.declarations(), name)
            .cloned()
            .map_err(status)
    }

    /// What a read asks for (a table's entries, or the one with a key), merged over the
    /// workers: the table's declaration, the version read at, and the entries.
    async fn read_entries(
        &self,
        r: pb::ReadRequest,
    ) -> Result<(Declaration, u64, Vec<stateplane_state::Entry>), Status> {
        let d = self.declaration(&r.table)?;
        let key = if r.key.is_empty() {
            None
        } else {
            Some(convert::key_from_pb(&r.key, convert::table_shape(&d)?.0)?)
        };
        let table = r.table;
        let done = self.blocking(move |plane| plane.read(&table, key)).await?;
        let Reply::Entries(entries) = done.reply else {
            return Err(Status::internal("a read answered no entries"));
        };
        Ok((d, done.version, entries))
    }

    /// Submits on a blocking thread (the call waits for every worker). A change is logged
    /// with the client it came `from` ([`endpoint::client_of`]) and how it ended.
    async fn submit(
        &self,
        from: Option<String>,
        request: Request,
    ) -> Result<stateplane_runtime::Applied, Status> {
        let change = change_of(&request);
        let done = self.blocking(move |plane| plane.submit(request)).await;
        if let Some(change) = change {
            let who = from.unwrap_or_else(|| "a client".to_string());
            match &done {
                Ok(d) => log::info!("control API: {change} by {who}, at version {}", d.version),
                Err(e) => log::info!("control API: {change} by {who}, refused: {}", e.message()),
            }
        }
        done
    }

    /// Runs `f` on the control plane on a blocking thread.
    async fn blocking(
        &self,
        f: impl FnOnce(&ControlPlane) -> Result<stateplane_runtime::Applied, ControlError>
        + Send
        + 'static,
    ) -> Result<stateplane_runtime::Applied, Status> {
        let plane = self.plane.clone();
        tokio::task::spawn_blocking(move || f(&plane))
            .await
            .map_err(|e| Status::internal(format!("the request's thread failed: {e}")))?
            .map_err(status)
    }
}

fn counters(cs: Vec<(&'static str, u64)>) -> Vec<pb::Counter> {
    cs.into_iter()
        .map(|(name, value)| pb::Counter {
            name: name.to_string(),
            value,
        })
        .collect()
}

type NotificationStream = Pin<Box<dyn Stream<Item = Result<pb::Notification, Status>> + Send>>;

#[tonic::async_trait]
impl control_server::Control for ControlService {
    async fn reload(
        &self,
        request: tonic::Request<pb::ReloadRequest>,
    ) -> Result<Response<pb::ReloadReply>, Status> {
        let Some(reloader) = self.reloader.clone() else {
            return Err(Status::unimplemented(
                "this run cannot reload: only a live switch (stateplane run on interfaces) \
                 reads its configuration again",
            ));
        };
        let who = endpoint::client_of(&request);
        log::info!("control API: reload by {who}");
        let (generation, taken) = tokio::task::spawn_blocking(move || reloader())
            .await
            .map_err(|e| Status::internal(format!("the request's thread failed: {e}")))?
            .map_err(|e| {
                Status::failed_precondition(format!(
                    "reload refused, the running program stays: {e}"
                ))
            })?;
        let workers = (taken.iter())
            .map(|t| pb::WorkerReload {
                worker: t.worker as u32,
                carried: t.carried.iter().map(convert::carried_to_pb).collect(),
            })
            .collect();
        Ok(Response::new(pb::ReloadReply {
            generation,
            workers,
            workers_running: self.plane.worker_count() as u32,
        }))
    }

    async fn describe(
        &self,
        _: tonic::Request<pb::DescribeRequest>,
    ) -> Result<Response<pb::DescribeReply>, Status> {
        Ok(Response::new(pb::DescribeReply {
            version: self.plane.version(),
            program: self.program.clone(),
            declarations: self
                .plane
                .declarations()
                .iter()
                .map(convert::declaration_to_pb)
                .collect(),
        }))
    }

    async fn write(
        &self,
        request: tonic::Request<pb::WriteRequest>,
    ) -> Result<Response<pb::WriteReply>, Status> {
        let from = Some(endpoint::client_of(&request));
        let r = request.into_inner();
        let d = self.declaration(&r.table)?;
        let writes = r
            .updates
            .iter()
            .map(|u| convert::write_from_pb(u, &d))
            .collect::<Result<_, _>>()?;
        let done = self
            .submit(
                from,
                Request::Write {
                    table: r.table,
                    writes,
                },
            )
            .await?;
        Ok(Response::new(pb::WriteReply {
            version: done.version,
        }))
    }

    async fn read(
        &self,
        request: tonic::Request<pb::ReadRequest>,
    ) -> Result<Response<pb::ReadReply>, Status> {
        let (d, version, entries) = self.read_entries(request.into_inner()).await?;
        Ok(Response::new(pb::ReadReply {
            version,
            entries: entries
                .iter()
                .map(|e| convert::entry_to_pb(e, &d))
                .collect(),
        }))
    }

    type ReadStreamStream = Pin<Box<dyn Stream<Item = Result<pb::ReadReply, Status>> + Send>>;

    async fn read_stream(
        &self,
        request: tonic::Request<pb::ReadRequest>,
    ) -> Result<Response<Self::ReadStreamStream>, Status> {
        let (d, version, entries) = self.read_entries(request.into_inner()).await?;
        // Each piece is converted as it goes out: the entries are held once, here.
        let (mut entries, mut first) = (entries.into_iter(), true);
        let pieces = std::iter::from_fn(move || {
            let piece: Vec<pb::Entry> = (entries.by_ref().take(crate::PIECE))
                .map(|e| convert::entry_to_pb(&e, &d))
                .collect();
            let send = first || !piece.is_empty();
            first = false;
            send.then_some(Ok(pb::ReadReply {
                version,
                entries: piece,
            }))
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(pieces))))
    }

    async fn write_stream(
        &self,
        request: tonic::Request<tonic::Streaming<pb::WriteRequest>>,
    ) -> Result<Response<pb::WriteReply>, Status> {
        let from = Some(endpoint::client_of(&request));
        let mut pieces = request.into_inner();
        let mut batch: Option<(Declaration, Vec<stateplane_state::Write>)> = None;
        while let Some(piece) = pieces.message().await? {
            let (d, writes) = match &mut batch {
                Some(b) => b,
                None => batch.insert((self.declaration(&piece.table)?, Vec::new())),
            };
            if piece.table != d.name {
                return Err(Status::invalid_argument(format!(
                    "a streamed write is to one table: `{}`, then `{}`",
                    d.name, piece.table
                )));
            }
            // More than deleting and inserting every entry the table holds is no batch.
            let most = d.capacity.max(1).saturating_mul(2);
            if writes.len() + piece.updates.len() > most {
                return Err(Status::out_of_range(format!(
                    "a batch of more than {most} updates to `{}`, twice what it holds",
                    d.name
                )));
            }
            for u in &piece.updates {
                writes.push(convert::write_from_pb(u, d)?);
            }
        }
        let Some((d, writes)) = batch else {
            return Err(Status::invalid_argument("a streamed write of no pieces"));
        };
        let done = self
            .submit(
                from,
                Request::Write {
                    table: d.name,
                    writes,
                },
            )
            .await?;
        Ok(Response::new(pb::WriteReply {
            version: done.version,
        }))
    }

    async fn counters_of(
        &self,
        request: tonic::Request<pb::CountersOfRequest>,
    ) -> Result<Response<pb::CountersOfReply>, Status> {
        let r = request.into_inner();
        let d = self.declaration(&r.table)?;
        let fields = convert::table_shape(&d)?.0;
        let keys = (r.keys.iter())
            .map(|k| convert::key_from_pb(&k.fields, fields))
            .collect::<Result<_, _>>()?;
        let done = self
            .submit(
                None,
                Request::CountersOf {
                    table: r.table,
                    keys,
                },
            )
            .await?;
        let Reply::CountersOf(workers) = done.reply else {
            return Err(Status::internal(
                "a counters-of request answered no counters",
            ));
        };
        Ok(Response::new(pb::CountersOfReply {
            version: done.version,
            workers: (workers.into_iter())
                .map(|w| pb::WorkerCounters {
                    worker: w.worker,
                    keys: (w.cells.into_iter())
                        .map(|index| pb::Counters { index })
                        .collect(),
                })
                .collect(),
        }))
    }

    async fn read_register(
        &self,
        request: tonic::Request<pb::RegisterRange>,
    ) -> Result<Response<pb::RegisterValues>, Status> {
        let r = request.into_inner();
        let (d, first, count) = self.register_range(&r)?;
        let done = self
            .submit(
                None,
                Request::ReadRegister {
                    name: r.name,
                    first,
                    count,
                },
            )
            .await?;
        let (Reply::Values(values), stateplane_state::Kind::Register { bits }) =
            (done.reply, &d.kind)
        else {
            return Err(Status::internal("a register read answered no values"));
        };
        Ok(Response::new(pb::RegisterValues {
            version: done.version,
            first: first as u64,
            values: values
                .into_iter()
                .map(|v| convert::to_bytes(v, *bits))
                .collect(),
        }))
    }

    async fn write_register(
        &self,
        request: tonic::Request<pb::RegisterWrite>,
    ) -> Result<Response<pb::WriteReply>, Status> {
        let from = Some(endpoint::client_of(&request));
        let r = request.into_inner();
        let range = r.range.unwrap_or_default();
        let (d, first, count) = self.register_range(&range)?;
        let stateplane_state::Kind::Register { bits } = d.kind else {
            return Err(Status::internal("not a register"));
        };
        let field = stateplane_state::control::Field::exact(
            "value",
            bits,
            stateplane_state::control::Format::Int,
        );
        let value = convert::from_bytes(&r.value, &field)?;
        let done = self
            .submit(
                from,
                Request::WriteRegister {
                    name: range.name,
                    first,
                    count,
                    value,
                },
            )
            .await?;
        Ok(Response::new(pb::WriteReply {
            version: done.version,
        }))
    }

    async fn set_meter(
        &self,
        request: tonic::Request<pb::MeterWrite>,
    ) -> Result<Response<pb::WriteReply>, Status> {
        let from = Some(endpoint::client_of(&request));
        let r = request.into_inner();
        let range = r.range.unwrap_or_default();
        let (_, first, count) = self.register_range(&range)?;
        let config = convert::meter_from_pb(&r.config.unwrap_or_default());
        let done = self
            .submit(
                from,
                Request::SetMeter {
                    name: range.name,
                    first,
                    count,
                    config,
                },
            )
            .await?;
        Ok(Response::new(pb::WriteReply {
            version: done.version,
        }))
    }

    async fn read_meter(
        &self,
        request: tonic::Request<pb::RegisterRange>,
    ) -> Result<Response<pb::MeterConfigs>, Status> {
        let r = request.into_inner();
        let (_, first, count) = self.register_range(&r)?;
        let done = self
            .submit(
                None,
                Request::ReadMeter {
                    name: r.name,
                    first,
                    count,
                },
            )
            .await?;
        let Reply::Meters(configs) = done.reply else {
            return Err(Status::internal("a meter read answered no settings"));
        };
        Ok(Response::new(pb::MeterConfigs {
            version: done.version,
            first: first as u64,
            configs: configs.iter().map(convert::meter_to_pb).collect(),
        }))
    }

    type NotificationsStream = NotificationStream;

    async fn notifications(
        &self,
        _: tonic::Request<pb::NotificationsRequest>,
    ) -> Result<Response<NotificationStream>, Status> {
        let from_workers = self.plane.subscribe();
        let declarations = self.plane.declarations();
        let (to_client, stream) = tokio::sync::mpsc::channel(1024);
        // A plain thread forwards: the workers' side is a blocking channel. It ends when
        // the client hangs up (or the control plane goes away).
        std::thread::Builder::new()
            .name("ctl-notify".into())
            .spawn(move || {
                loop {
                    match from_workers.recv_timeout(Duration::from_millis(200)) {
                        Ok(n) => {
                            let d = declarations.iter().find(|d| d.name == n.table);
                            let n = convert::notification_to_pb(&n, d);
                            if to_client.blocking_send(Ok(n)).is_err() {
                                return;
                            }
                        }
                        Err(crossbeam::RecvTimeoutError::Timeout) if to_client.is_closed() => {
                            return;
                        }
                        Err(crossbeam::RecvTimeoutError::Timeout) => {}
                        Err(crossbeam::RecvTimeoutError::Disconnected) => return,
                    }
                }
            })
            .map_err(|e| Status::internal(format!("cannot start a stream: {e}")))?;
        Ok(Response::new(Box::pin(
            tokio_stream::wrappers::ReceiverStream::new(stream),
        )))
    }

    async fn stats(
        &self,
        request: tonic::Request<pb::StatsRequest>,
    ) -> Result<Response<pb::StatsReply>, Status> {
        let table = request.into_inner().table;
        let mut pipeline: Vec<pb::Counter> = (self.pipeline)()
            .into_iter()
            .map(|(name, value)| pb::Counter { name, value })
            .collect();
        let load = |c: &std::sync::atomic::AtomicU64| c.load(std::sync::atomic::Ordering::Relaxed);
        pipeline.push(pb::Counter {
            name: "notifications_dropped".into(),
            value: load(&self.plane.notifications_dropped),
        });
        pipeline.push(pb::Counter {
            name: "program_requests_refused".into(),
            value: load(&self.plane.requests_refused),
        });
        let (version, table) = if table.is_empty() {
            (self.plane.version(), Vec::new())
        } else {
            let done = self.submit(None, Request::Stats { table }).await?;
            match done.reply {
                Reply::Counters(cs) => (done.version, counters(cs)),
                _ => (done.version, Vec::new()),
            }
        };
        Ok(Response::new(pb::StatsReply {
            version,
            pipeline,
            table,
        }))
    }

    async fn flows(
        &self,
        request: tonic::Request<pb::FlowsRequest>,
    ) -> Result<Response<pb::FlowsReply>, Status> {
        let from = Some(endpoint::client_of(&request));
        let r = request.into_inner();
        let change = convert::flow_change_from_pb(r.change.as_ref())?;
        let (reply, flows) = self.apply_flows(from, r.name, change).await?;
        Ok(Response::new(pb::FlowsReply {
            flows: flows.iter().map(convert::flow_to_pb).collect(),
            ..reply
        }))
    }

    type FlowsStreamStream = Pin<Box<dyn Stream<Item = Result<pb::FlowsReply, Status>> + Send>>;

    async fn flows_stream(
        &self,
        request: tonic::Request<tonic::Streaming<pb::FlowsRequest>>,
    ) -> Result<Response<Self::FlowsStreamStream>, Status> {
        let from = Some(endpoint::client_of(&request));
        let mut pieces = request.into_inner();
        let mut whole: Option<(String, FlowChange)> = None;
        while let Some(piece) = pieces.message().await? {
            let change = convert::flow_change_from_pb(piece.change.as_ref())?;
            match &mut whole {
                None => whole = Some((piece.name, change)),
                Some((name, so_far)) => {
                    if piece.name != *name {
                        return Err(Status::invalid_argument(format!(
                            "a streamed flows request is to one pipeline: `{name}`, then `{}`",
                            piece.name
                        )));
                    }
                    join_lines(so_far, change)?;
                }
            }
        }
        let Some((name, change)) = whole else {
            return Err(Status::invalid_argument(
                "a flows stream with no request in it",
            ));
        };
        let (reply, flows) = self.apply_flows(from, name, change).await?;
        // Each piece is converted as it goes out: the rules are held once, here.
        let (mut flows, mut first) = (flows.into_iter(), true);
        let pieces = std::iter::from_fn(move || {
            let piece: Vec<pb::Flow> = (flows.by_ref().take(crate::PIECE))
                .map(|f| convert::flow_to_pb(&f))
                .collect();
            let send = first || !piece.is_empty();
            first = false;
            send.then(|| {
                Ok(pb::FlowsReply {
                    flows: piece,
                    ..reply.clone()
                })
            })
        });
        Ok(Response::new(Box::pin(tokio_stream::iter(pieces))))
    }
}

/// Joins a further piece of a streamed add or replace to what came before: the same
/// change (the same table, the same counters' keeping), more lines.
fn join_lines(so_far: &mut FlowChange, more: FlowChange) -> Result<(), Status> {
    match (so_far, more) {
        (
            FlowChange::Add {
                lines,
                keep_counters,
            },
            FlowChange::Add {
                lines: more,
                keep_counters: keep,
            },
        ) if *keep_counters == keep => lines.extend(more),
        (
            FlowChange::Replace { table, lines },
            FlowChange::Replace {
                table: t,
                lines: more,
            },
        ) if *table == t => lines.extend(more),
        _ => {
            return Err(Status::invalid_argument(
                "only the lines of one add or one replace come in several messages, each \
                 the same change",
            ));
        }
    }
    Ok(())
}

impl ControlService {
    /// Applies a change to the rules of `name` (from the client `from`): the reply's
    /// version, added and kept, and the rules it answers with (dumped, modified, deleted,
    /// or those a replace deleted).
    async fn apply_flows(
        &self,
        from: Option<String>,
        name: String,
        change: FlowChange,
    ) -> Result<(pb::FlowsReply, Vec<stateplane_state::FlowStat>), Status> {
        let done = self.submit(from, Request::Flows { name, change }).await?;
        let (flows, added, kept) = match done.reply {
            Reply::Flows(fs) => (fs, 0, 0),
            Reply::Replaced {
                removed,
                added,
                kept,
            } => (removed, added, kept),
            _ => (Vec::new(), 0, 0),
        };
        let reply = pb::FlowsReply {
            version: done.version,
            flows: Vec::new(),
            added,
            kept,
        };
        Ok((reply, flows))
    }
}

impl ControlService {
    /// A register's declaration and the range asked for (count 0: to the end).
    fn register_range(&self, r: &pb::RegisterRange) -> Result<(Declaration, usize, usize), Status> {
        let d = self.declaration(&r.name)?;
        let first = usize::try_from(r.first).unwrap_or(usize::MAX);
        let count = match r.count {
            0 => d.capacity.saturating_sub(first),
            n => usize::try_from(n).unwrap_or(usize::MAX),
        };
        Ok((d, first, count))
    }
}

mod crossbeam {
    pub use stateplane_runtime::control::RecvTimeoutError;
}

/// The HTTP/2 flow-control window of the APIs' servers and clients.
pub const WINDOW: u32 = 8 << 20;

/// The largest HTTP/2 frame the APIs' servers and clients take: a reply of 65,536 values
/// goes in a few frames rather than sixteen of the default 16 KiB.
pub const FRAME: u32 = 1 << 20;

/// A running API server; stops when dropped (and removes its socket).
pub struct Server {
    /// Where it listens, as `stateplane ctl --server` takes it (a TCP port asked as 0 is
    /// the one given).
    pub endpoint: Listen,
    /// The Unix socket it placed, and its inode: removed on drop while it is still ours.
    socket: Option<(PathBuf, u64)>,
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Server {
    /// Serves `service` at `listen`, on a thread of its own.
    pub fn start(listen: &Listen, service: ControlService) -> Result<Server, String> {
        let counts = service.requests();
        Server::serve(listen, "control API", move |mut builder, token| {
            builder.add_service(Counted {
                inner: control_server::ControlServer::with_interceptor(service, token),
                counts,
            })
        })
    }

    /// A gRPC server whose HTTP/2 windows take a large answer (65,536 values) in one go,
    /// not in 64 KiB turns each waiting for the client's window update.
    fn builder() -> tonic::transport::Server {
        tonic::transport::Server::builder()
            .initial_stream_window_size(Some(WINDOW))
            .initial_connection_window_size(Some(WINDOW))
            .max_frame_size(Some(FRAME))
    }

    /// Listens at `listen` and serves what `router` makes of a server builder (TLS set up
    /// when the endpoint is guarded) and the token check every service is wrapped in, on a
    /// thread of its own; `what` names it in messages.
    pub fn serve(
        listen: &Listen,
        what: &'static str,
        router: impl FnOnce(tonic::transport::Server, CheckToken) -> tonic::transport::server::Router
        + Send
        + 'static,
    ) -> Result<Server, String> {
        let mut builder = Server::builder();
        let mut token = CheckToken::default();
        let (bound, endpoint, socket) = match listen {
            Listen::Unix(path) => {
                let listener = endpoint::bind_unix(path, what)?;
                let inode = std::fs::metadata(path).map_err(|e| e.to_string())?.ino();
                let socket = Some((path.clone(), inode));
                (Bound::Unix(listener), listen.clone(), socket)
            }
            Listen::Tcp { addr, guard } => {
                if guard.is_none() && !addr.ip().is_loopback() {
                    return Err(format!(
                        "the {what} listens beyond loopback only with TLS and a token or \
                         client certificates; give 127.0.0.1:{} instead of {addr}",
                        addr.port()
                    ));
                }
                if let Some(guard) = guard {
                    builder = builder
                        .tls_config(guard.tls())
                        .map_err(|e| format!("the {what}'s TLS settings: {e}"))?;
                    token = guard.check_token();
                }
                let listener = std::net::TcpListener::bind(addr)
                    .map_err(|e| format!("cannot listen for the {what} on {addr}: {e}"))?;
                let addr = listener.local_addr().map_err(|e| e.to_string())?;
                let endpoint = Listen::Tcp {
                    addr,
                    guard: guard.clone(),
                };
                (Bound::Tcp(listener), endpoint, None)
            }
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| format!("cannot start the {what}'s runtime: {e}"))?;
        let (shutdown, stopped) = tokio::sync::oneshot::channel::<()>();
        let stopped = async {
            let _ = stopped.await;
        };
        let thread = std::thread::Builder::new()
            .name(what.replace(' ', "-"))
            .spawn(move || {
                runtime.block_on(async move {
                    let router = router(builder, token);
                    let served = match bound.into_tokio() {
                        Ok(TokioBound::Unix(listener)) => {
                            let incoming =
                                tokio_stream::wrappers::UnixListenerStream::new(listener);
                            router.serve_with_incoming_shutdown(incoming, stopped).await
                        }
                        // Answers go out at once, not held back for more to send (Nagle's
                        // algorithm against the client's delayed acknowledgement costs 40 ms).
                        Ok(TokioBound::Tcp(listener)) => {
                            let incoming = tokio_stream::StreamExt::map(
                                tokio_stream::wrappers::TcpListenerStream::new(listener),
                                |accepted| accepted.and_then(|s| s.set_nodelay(true).map(|()| s)),
                            );
                            router.serve_with_incoming_shutdown(incoming, stopped).await
                        }
                        Err(e) => {
                            log::error!("{what}: {e}");
                            return;
                        }
                    };
                    if let Err(e) = served {
                        log::error!("{what} stopped: {e}");
                    }
                });
            })
            .map_err(|e| format!("cannot start the {what}'s thread: {e}"))?;
        log::info!("{what} listening on {endpoint}");
        Ok(Server {
            endpoint,
            socket,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }
}

/// A listener made on the caller's thread (so that errors reach the caller), to be served
/// on the server's runtime.
enum Bound {
    Unix(std::os::unix::net::UnixListener),
    Tcp(std::net::TcpListener),
}

enum TokioBound {
    Unix(tokio::net::UnixListener),
    Tcp(tokio::net::TcpListener),
}

impl Bound {
    /// Inside the runtime that will serve it.
    fn into_tokio(self) -> std::io::Result<TokioBound> {
        Ok(match self {
            Bound::Unix(l) => {
                l.set_nonblocking(true)?;
                TokioBound::Unix(tokio::net::UnixListener::from_std(l)?)
            }
            Bound::Tcp(l) => {
                l.set_nonblocking(true)?;
                TokioBound::Tcp(tokio::net::TcpListener::from_std(l)?)
            }
        })
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if let Some(s) = self.shutdown.take() {
            let _ = s.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        // Another server may have replaced a socket it found stale; that one stays.
        if let Some((path, inode)) = self.socket.take()
            && std::fs::metadata(&path).is_ok_and(|m| m.ino() == inode)
        {
            let _ = std::fs::remove_file(&path);
        }
    }
}

/// A change a client asks for, as the log says it (`None` for a read).
fn change_of(request: &Request) -> Option<String> {
    use stateplane_state::FlowChange;
    Some(match request {
        Request::Write { table, writes } => format!("{} updates to `{table}`", writes.len()),
        Request::WriteRegister {
            name,
            first,
            count,
            value,
        } => format!("`{name}` {first}..{} set to {value}", first + count),
        Request::SetMeter {
            name, first, count, ..
        } => format!("meters `{name}` {first}..{} set", first + count),
        Request::Flows { name, change } => match change {
            FlowChange::Add { lines, .. } => {
                format!("{} rule lines added to `{name}`", lines.len())
            }
            FlowChange::Replace { lines, .. } => {
                format!("`{name}` replaced by {} rule lines", lines.len())
            }
            FlowChange::Modify { .. } => format!("rules of `{name}` modified"),
            FlowChange::Delete(_) => format!("rules of `{name}` deleted"),
            FlowChange::Dump(_) | FlowChange::Expire(_) => return None,
        },
        _ => return None,
    })
}
