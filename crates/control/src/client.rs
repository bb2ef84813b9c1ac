//! A blocking client of the control API (what `stateplane ctl` and tests use).

use crate::convert;
use crate::endpoint::{self, AddToken, ClientFiles};
use crate::pb::{self, control_client::ControlClient};
use stateplane_runtime::Taken;
use stateplane_state::control::Field;
use stateplane_state::{Declaration, Entry, FlowChange, Match, MeterConfig, WorkerCounters, Write};
use std::time::Duration;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::Channel;

/// What a reload through the control API did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reloaded {
    /// The program generation the workers run now.
    pub generation: u64,
    /// The run's workers.
    pub workers_running: usize,
    /// What each worker that took the new program within the switch's wait kept.
    pub taken: Vec<Taken>,
}

impl Reloaded {
    /// The workers that had not taken the new program when the switch answered.
    pub fn not_taken(&self) -> Vec<usize> {
        (0..self.workers_running)
            .filter(|w| !self.taken.iter().any(|t| t.worker == *w))
            .collect()
    }
}

pub struct Client {
    runtime: tokio::runtime::Runtime,
    inner: ControlClient<InterceptedService<Channel, AddToken>>,
    program: String,
    declarations: Vec<Declaration>,
}

/// A refusal from the server (its gRPC code and message) or a failure to reach it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClientError {
    pub code: tonic::Code,
    pub message: String,
}

impl std::fmt::Display for ClientError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.message)
    }
}

impl std::error::Error for ClientError {}

impl From<tonic::Status> for ClientError {
    fn from(s: tonic::Status) -> Self {
        ClientError {
            code: s.code(),
            message: s.message().to_string(),
        }
    }
}

fn local(message: String) -> ClientError {
    ClientError {
        code: tonic::Code::InvalidArgument,
        message,
    }
}

impl Client {
    /// Connects to the control API at `server` without TLS or a token (a Unix socket, or
    /// loopback TCP) and reads what the program declares.
    pub fn connect(server: &str) -> Result<Client, ClientError> {
        Client::connect_with(server, &ClientFiles::default())
    }

    /// Connects to the control API at `server` (`unix:PATH`, `HOST:PORT` or
    /// `https://HOST:PORT`) proving itself with `files`, and reads what the program
    /// declares.
    pub fn connect_with(server: &str, files: &ClientFiles) -> Result<Client, ClientError> {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .map_err(|e| local(format!("cannot start a runtime: {e}")))?;
        // A user's default socket and root's differ: say where a switch puts its own.
        let hint = format!(
            "is `stateplane run` running with --control {server}? A switch listens by \
             default on control.sock in its run directory: ${}, else /run/stateplane for \
             root; give ctl the same, or --server",
            endpoint::RUN_DIR_VAR
        );
        let (channel, token) =
            runtime.block_on(endpoint::connect(server, files, "control API", &hint))?;
        let inner = ControlClient::with_interceptor(channel, token);
        let mut client = Client {
            runtime,
            inner,
            program: String::new(),
            declarations: Vec::new(),
        };
        client.refresh()?;
        Ok(client)
    }

    /// Reads the program's declarations again (after a reload).
    pub fn refresh(&mut self) -> Result<u64, ClientError> {
        let reply = self
            .runtime
            .block_on(self.inner.describe(pb::DescribeRequest {}))?
            .into_inner();
        self.declarations = reply
            .declarations
            .iter()
            .map(convert::declaration_from_pb)
            .collect::<Result<_, _>>()
            .map_err(local)?;
        self.program = reply.program;
        Ok(reply.version)
    }

    pub fn program(&self) -> &str {
        &self.program
    }

    pub fn declarations(&self) -> &[Declaration] {
        &self.declarations
    }

    pub fn declaration(&self, name: &str) -> Result<&Declaration, ClientError> {
        stateplane_state::control::find(&self.declarations, name)
            .map_err(|e| ClientError::from(convert::status(e)))
    }

    /// Applies `writes` to `table`, all or none; returns the version.
    pub fn write(&mut self, table: &str, writes: &[Write]) -> Result<u64, ClientError> {
        let d = self.declaration(table)?.clone();
        let (key, _) = convert::table_shape(&d)?;
        let updates: Vec<pb::Update> = writes.iter().map(|w| update_of(w, &d, key)).collect();
        let request = |updates| pb::WriteRequest {
            table: table.to_string(),
            updates,
        };
        if updates.len() > crate::PIECE {
            // In pieces, applied as one batch when the stream ends.
            let mut updates = updates;
            let mut pieces = Vec::new();
            while !updates.is_empty() {
                let rest = updates.split_off(updates.len().min(crate::PIECE));
                pieces.push(request(std::mem::replace(&mut updates, rest)));
            }
            return Ok(self
                .runtime
                .block_on(self.inner.write_stream(tokio_stream::iter(pieces)))?
                .into_inner()
                .version);
        }
        Ok(self
            .runtime
            .block_on(self.inner.write(request(updates)))?
            .into_inner()
            .version)
    }

    /// Writes `writes` to `table` as one batch, all or none, taking them from the iterator
    /// as they are sent (in pieces of [`crate::PIECE`]), so that a batch of any size never
    /// sits whole in the client. An `Err` from the iterator stops the batch: the server is
    /// made to refuse what it was sent, nothing is applied, and the error is returned. The
    /// version and the writes sent.
    pub fn write_each(
        &mut self,
        table: &str,
        writes: impl Iterator<Item = Result<Write, String>> + Send + 'static,
    ) -> Result<(u64, u64), ClientError> {
        use std::sync::{Arc, Mutex};
        let d = self.declaration(table)?.clone();
        let key = convert::table_shape(&d)?.0.to_vec();
        let stopped: Arc<Mutex<Option<String>>> = Arc::default();
        let sent = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let (stop, count) = (stopped.clone(), sent.clone());
        let mut writes = writes.fuse();
        let mut done = false;
        let pieces = std::iter::from_fn(move || {
            if done {
                return None;
            }
            let mut updates = Vec::with_capacity(crate::PIECE);
            for w in writes.by_ref() {
                match w {
                    Ok(w) => updates.push(update_of(&w, &d, &key)),
                    Err(e) => {
                        *stop
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                        done = true;
                        // A piece for no table: the server refuses the whole batch.
                        return Some(pb::WriteRequest::default());
                    }
                }
                if updates.len() == crate::PIECE {
                    break;
                }
            }
            if updates.is_empty() {
                done = true;
                return None;
            }
            count.fetch_add(updates.len() as u64, std::sync::atomic::Ordering::Relaxed);
            Some(pb::WriteRequest {
                table: d.name.clone(),
                updates,
            })
        });
        let call = self.inner.write_stream(tokio_stream::iter(pieces));
        let done = self.runtime.block_on(call);
        if let Some(e) = stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take()
        {
            return Err(local(format!("{e} (nothing was written)")));
        }
        let version = done?.into_inner().version;
        Ok((version, sent.load(std::sync::atomic::Ordering::Relaxed)))
    }

    /// Every entry of `table` (or the one with `key`), and the version read.
    pub fn read(
        &mut self,
        table: &str,
        key: Option<&[Match]>,
    ) -> Result<(u64, Vec<Entry>), ClientError> {
        let mut all = Vec::new();
        let version = self.read_each(table, key, |piece| {
            all.extend(piece);
            Ok(())
        })?;
        Ok((version, all))
    }

    /// As [`Client::read`], handing `each` the entries a piece at a time as they come (at
    /// most [`crate::PIECE`]), so that a table of any size is read in the memory of one
    /// piece: the version read at.
    pub fn read_each(
        &mut self,
        table: &str,
        key: Option<&[Match]>,
        mut each: impl FnMut(Vec<Entry>) -> Result<(), ClientError>,
    ) -> Result<u64, ClientError> {
        let d = self.declaration(table)?.clone();
        let (fields, _) = convert::table_shape(&d)?;
        let request = pb::ReadRequest {
            table: table.to_string(),
            key: key.map_or_else(Vec::new, |k| convert::key_to_pb(k, fields)),
        };
        let mut pieces = self
            .runtime
            .block_on(self.inner.read_stream(request))?
            .into_inner();
        let mut version = 0;
        while let Some(piece) = self.runtime.block_on(pieces.message())? {
            version = piece.version;
            let entries = (piece.entries.iter())
                .map(|e| {
                    let mut entry = convert::entry_from_pb(e, &d)?;
                    entry.hits = e.hits;
                    Ok(entry)
                })
                .collect::<Result<_, tonic::Status>>()?;
            each(entries)?;
        }
        Ok(version)
    }

    /// Where each of `keys` (keys of `table`, a table the program reports a sketch's keys
    /// in) is counted in the program's sketch register, per worker (see
    /// [`WorkerCounters`]).
    pub fn counters_of(
        &mut self,
        table: &str,
        keys: &[Vec<Match>],
    ) -> Result<Vec<WorkerCounters>, ClientError> {
        let d = self.declaration(table)?.clone();
        let (fields, _) = convert::table_shape(&d)?;
        let request = pb::CountersOfRequest {
            table: table.to_string(),
            keys: (keys.iter())
                .map(|k| pb::Key {
                    fields: convert::key_to_pb(k, fields),
                })
                .collect(),
        };
        let reply = (self.runtime)
            .block_on(self.inner.counters_of(request))?
            .into_inner();
        Ok((reply.workers.into_iter())
            .map(|w| WorkerCounters {
                worker: w.worker,
                cells: w.keys.into_iter().map(|c| c.index).collect(),
            })
            .collect())
    }

    /// `count` values of register `name` from `first` (count 0: to the end).
    pub fn read_register(
        &mut self,
        name: &str,
        first: u64,
        count: u64,
    ) -> Result<Vec<Vec<u8>>, ClientError> {
        let request = pb::RegisterRange {
            name: name.to_string(),
            first,
            count,
        };
        Ok(self
            .runtime
            .block_on(self.inner.read_register(request))?
            .into_inner()
            .values)
    }

    pub fn write_register(
        &mut self,
        name: &str,
        first: u64,
        count: u64,
        value: Vec<u8>,
    ) -> Result<u64, ClientError> {
        let request = pb::RegisterWrite {
            range: Some(pb::RegisterRange {
                name: name.to_string(),
                first,
                count,
            }),
            value,
        };
        Ok(self
            .runtime
            .block_on(self.inner.write_register(request))?
            .into_inner()
            .version)
    }

    /// Sets `count` meters of `name` from `first` (count 0: to the end); returns the version.
    pub fn set_meter(
        &mut self,
        name: &str,
        first: u64,
        count: u64,
        config: &MeterConfig,
    ) -> Result<u64, ClientError> {
        let request = pb::MeterWrite {
            range: Some(pb::RegisterRange {
                name: name.to_string(),
                first,
                count,
            }),
            config: Some(convert::meter_to_pb(config)),
        };
        Ok(self
            .runtime
            .block_on(self.inner.set_meter(request))?
            .into_inner()
            .version)
    }

    /// The settings of `count` meters of `name` from `first` (count 0: to the end).
    pub fn read_meter(
        &mut self,
        name: &str,
        first: u64,
        count: u64,
    ) -> Result<Vec<MeterConfig>, ClientError> {
        let request = pb::RegisterRange {
            name: name.to_string(),
            first,
            count,
        };
        let reply = self
            .runtime
            .block_on(self.inner.read_meter(request))?
            .into_inner();
        Ok(reply.configs.iter().map(convert::meter_from_pb).collect())
    }

    /// The pipeline's counters, and `table`'s if given.
    /// Reloads the switch's program from its configuration: the generation the workers
    /// run, and what each worker's program kept of the old one's state (by worker). The
    /// declarations are read again.
    pub fn reload(&mut self) -> Result<Reloaded, ClientError> {
        let reply = (self.runtime)
            .block_on(self.inner.reload(pb::ReloadRequest {}))?
            .into_inner();
        let workers = (reply.workers.iter())
            .map(|w| {
                let carried = w.carried.iter().map(convert::carried_from_pb);
                Ok(Taken {
                    worker: w.worker as usize,
                    generation: reply.generation,
                    carried: carried.collect::<Result<_, _>>().map_err(local)?,
                })
            })
            .collect::<Result<_, ClientError>>()?;
        self.refresh()?;
        Ok(Reloaded {
            generation: reply.generation,
            workers_running: reply.workers_running as usize,
            taken: workers,
        })
    }

    pub fn stats(&mut self, table: &str) -> Result<pb::StatsReply, ClientError> {
        let request = pb::StatsRequest {
            table: table.to_string(),
        };
        Ok(self
            .runtime
            .block_on(self.inner.stats(request))?
            .into_inner())
    }

    /// Applies a change to rule pipeline `name` (or dumps it); the version, the rules
    /// dumped, modified or deleted, and what a replace added and kept.
    /// Applies `change` to the rules of the pipeline `name`: the version, added and kept,
    /// with every rule it answers with (see [`Client::flows_each`]).
    pub fn flows(
        &mut self,
        name: &str,
        change: &FlowChange,
    ) -> Result<pb::FlowsReply, ClientError> {
        let mut flows = Vec::new();
        let mut reply = self.flows_each(name, change, |piece| {
            flows.extend(piece);
            Ok(())
        })?;
        reply.flows = flows;
        Ok(reply)
    }

    /// Applies `change` to the rules of the pipeline `name`, of any size: the lines of an
    /// add or a replace go in pieces (applied all or none), and the rules it answers with
    /// (dumped, modified, deleted) come to `each` piece by piece. The version, added and
    /// kept (with no rules).
    pub fn flows_each(
        &mut self,
        name: &str,
        change: &FlowChange,
        mut each: impl FnMut(Vec<pb::Flow>) -> Result<(), ClientError>,
    ) -> Result<pb::FlowsReply, ClientError> {
        let requests: Vec<pb::FlowsRequest> = flow_pieces(change)
            .iter()
            .map(|piece| {
                Ok(pb::FlowsRequest {
                    name: name.to_string(),
                    change: Some(convert::flow_change_to_pb(piece)?),
                })
            })
            .collect::<Result<_, tonic::Status>>()?;
        let call = self.inner.flows_stream(tokio_stream::iter(requests));
        let mut pieces = self.runtime.block_on(call)?.into_inner();
        let mut reply = pb::FlowsReply::default();
        while let Some(mut piece) = self.runtime.block_on(pieces.message())? {
            each(std::mem::take(&mut piece.flows))?;
            reply = piece;
        }
        Ok(reply)
    }

    /// Streams notifications to `each` until it returns false, `limit` have come, or
    /// `timeout` passes without one; returns how many came.
    pub fn watch(
        &mut self,
        limit: Option<u64>,
        timeout: Option<Duration>,
        mut each: impl FnMut(&pb::Notification) -> bool,
    ) -> Result<u64, ClientError> {
        let inner = &mut self.inner;
        self.runtime.block_on(async move {
            let mut stream = inner
                .notifications(pb::NotificationsRequest {})
                .await?
                .into_inner();
            let mut seen = 0;
            while limit.is_none_or(|l| seen < l) {
                let next = match timeout {
                    Some(t) => match tokio::time::timeout(t, stream.message()).await {
                        Ok(m) => m?,
                        Err(_) => break,
                    },
                    None => stream.message().await?,
                };
                let Some(n) = next else { break };
                seen += 1;
                if !each(&n) {
                    break;
                }
            }
            Ok(seen)
        })
    }
}

/// A change in the pieces it is sent in: an add's or a replace's lines in runs of at most
/// [`crate::PIECE`] lines and about 1 MiB (well inside gRPC's 4 MB message limit), any
/// other change whole.
fn flow_pieces(change: &FlowChange) -> Vec<FlowChange> {
    const BYTES: usize = 1 << 20;
    let lines = match change {
        FlowChange::Add { lines, .. } | FlowChange::Replace { lines, .. } => lines,
        _ => return vec![change.clone()],
    };
    let mut runs: Vec<Vec<String>> = vec![Vec::new()];
    let mut bytes = 0;
    for line in lines {
        let run_full = runs.last().is_some_and(|r| r.len() >= crate::PIECE);
        if run_full || (bytes + line.len() > BYTES && bytes > 0) {
            runs.push(Vec::new());
            bytes = 0;
        }
        bytes += line.len();
        if let Some(run) = runs.last_mut() {
            run.push(line.clone());
        }
    }
    (runs.into_iter())
        .map(|lines| match change {
            FlowChange::Add { keep_counters, .. } => FlowChange::Add {
                lines,
                keep_counters: *keep_counters,
            },
            FlowChange::Replace { table, .. } => FlowChange::Replace {
                table: *table,
                lines,
            },
            other => other.clone(),
        })
        .collect()
}

/// A write as the API carries it, for the table `d` declares (whose key is `key`).
fn update_of(w: &Write, d: &Declaration, key: &[Field]) -> pb::Update {
    use pb::update::Type;
    let (t, entry) = match w {
        Write::Insert(e) => (Type::Insert, convert::entry_to_pb(e, d)),
        Write::Modify(e) => (Type::Modify, convert::entry_to_pb(e, d)),
        Write::Delete(k) => (
            Type::Delete,
            pb::Entry {
                key: convert::key_to_pb(k, key),
                ..Default::default()
            },
        ),
    };
    pb::Update {
        r#type: t as i32,
        entry: Some(entry),
    }
}

#[cfg(test)]
mod reload_tests {
    use super::*;

    /// A reload's answer names the workers that had not taken the new program: those of
    /// the run missing from what was taken.
    #[test]
    fn the_workers_missing_from_a_reload_are_named() {
        let taken = |worker| Taken {
            worker,
            generation: 3,
            carried: Vec::new(),
        };
        let reloaded = Reloaded {
            generation: 3,
            workers_running: 4,
            taken: vec![taken(0), taken(2)],
        };
        assert_eq!(reloaded.not_taken(), [1, 3]);
        let all = Reloaded {
            taken: (0..4).map(taken).collect(),
            ..reloaded
        };
        assert_eq!(all.not_taken(), Vec::<usize>::new());
    }
}
