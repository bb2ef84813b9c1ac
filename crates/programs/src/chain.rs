//! `chain`: programs one after another, e.g. `acl` then `nat` then `router`.
//!
//! Each stage sees only the packets every stage before it passed (sent on, or flooded);
//! a packet a stage drops or hands to the control plane is done, with that verdict. The
//! last stage's choice of port stands: an earlier stage's port only says "pass". Packets a
//! stage rewrites reach the next stage rewritten, with their parse as the rewriting stage
//! left it (`nat` updates the flow key it rewrites, so a `router` after it routes by the
//! translated address).
//!
//! Drop reasons are each stage's, named `stage.reason` (`nat.no_translation`); state is
//! each stage's under its own names, and control-plane requests go to the stage that
//! declares the name, so two stages may not declare the same name. Configuration: `stages`,
//! the programs in order (each at most once), and each one's settings in a table named
//! after it: `[program.chain.nat]`.

use crate::{ConfigError, PortNames};
use serde::Deserialize;
use stateplane_runtime::{
    Burst, Context, DropReason, PortId, Prepared, Program, ProgramFactory, Running, Steering,
    Verdict,
};
use stateplane_state::{Carried, ControlError, Declaration, Notification, Reply, Request};
use std::collections::BTreeMap;
use std::sync::Arc;

/// Every key besides `stages` is a stage's settings (so unknown keys are caught by
/// `factory`, which names the stages, rather than by serde).
#[derive(Debug, Clone, Deserialize)]
pub struct ChainConfig {
    pub stages: Vec<String>,
    /// Each stage's settings, by its name.
    #[serde(flatten)]
    pub settings: BTreeMap<String, toml::Value>,
}

/// The most drop reasons a program may name (`DropReason::program` codes).
const MAX_REASONS: usize = DropReason::COUNT - DropReason::PROGRAM_BASE as usize;

pub struct Chain {
    /// Each stage's program name, in order.
    names: Arc<[String]>,
    stages: Vec<Box<dyn Running>>,
    /// Where each stage's drop reasons start among the chain's.
    reason_base: Vec<u8>,
    reasons: &'static [&'static str],
    /// Which stage declares each name.
    owner: BTreeMap<String, usize>,
}

/// Builds the chain's factory: each stage's factory from its settings, checked together.
pub fn factory(
    cfg: &ChainConfig,
    ports: &PortNames,
    field: &str,
) -> Result<ProgramFactory, ConfigError> {
    if cfg.stages.is_empty() {
        return Err(ConfigError::new(
            format!("{field}.stages"),
            "give the programs in order, like stages = [\"acl\", \"nat\"]",
        ));
    }
    if let Some(extra) = cfg.settings.keys().find(|k| !cfg.stages.contains(k)) {
        return Err(ConfigError::new(
            format!("{field}.{extra}"),
            format!(
                "'{extra}' is not one of the stages; settings go in a table named after a stage"
            ),
        ));
    }
    let mut factories = Vec::new();
    for (i, name) in cfg.stages.iter().enumerate() {
        if name == "chain" || cfg.stages[..i].contains(name) {
            return Err(ConfigError::new(
                format!("{field}.stages"),
                format!("'{name}' appears twice or is a chain: each program at most once"),
            ));
        }
        let built = crate::build(name, cfg.settings.get(name), ports).map_err(|e| {
            // The stage's own field names, placed inside the chain's table.
            let inner = e.field.strip_prefix("program.").unwrap_or(&e.field);
            let table = |prefix: &str| format!("`[{prefix}.{name}]`");
            let problem = e.problem.replace(&table("program"), &table(field));
            ConfigError::new(format!("{field}.{inner}"), problem)
        })?;
        factories.push(built);
    }
    // One instance, to check what the stages declare and name together.
    let probe = Chain::new(&cfg.stages, &factories, 0, field)?;
    let (names, reasons) = (probe.names, probe.reasons);
    Ok(Arc::new(move |worker| {
        Box::new(Chain::assemble(&names, &factories, worker, reasons))
    }))
}

impl Chain {
    fn new(
        names: &[String],
        factories: &[ProgramFactory],
        worker: usize,
        field: &str,
    ) -> Result<Chain, ConfigError> {
        let stages: Vec<Box<dyn Running>> = factories.iter().map(|f| f(worker)).collect();
        let mut reasons = Vec::new();
        for (name, stage) in names.iter().zip(&stages) {
            reasons.extend(stage.drop_reasons().iter().map(|r| format!("{name}.{r}")));
        }
        if reasons.len() > MAX_REASONS {
            return Err(ConfigError::new(
                format!("{field}.stages"),
                format!(
                    "the stages name {} drop reasons, more than the {MAX_REASONS} a program may",
                    reasons.len()
                ),
            ));
        }
        let mut owner: BTreeMap<String, usize> = BTreeMap::new();
        for (i, stage) in stages.iter().enumerate() {
            for d in stage.declarations() {
                if let Some(&j) = owner.get(&d.name) {
                    return Err(ConfigError::new(
                        format!("{field}.stages"),
                        format!(
                            "'{}' and '{}' both declare `{}`; the control plane could not \
                             tell them apart",
                            names[j], names[i], d.name
                        ),
                    ));
                }
                owner.insert(d.name, i);
            }
        }
        Ok(Chain::with(names.into(), stages, interned(reasons), owner))
    }

    /// A worker's chain, from stages already checked together.
    fn assemble(
        names: &Arc<[String]>,
        factories: &[ProgramFactory],
        worker: usize,
        reasons: &'static [&'static str],
    ) -> Chain {
        let stages: Vec<Box<dyn Running>> = factories.iter().map(|f| f(worker)).collect();
        let mut owner = BTreeMap::new();
        for (i, stage) in stages.iter().enumerate() {
            for d in stage.declarations() {
                owner.entry(d.name).or_insert(i);
            }
        }
        Chain::with(names.clone(), stages, reasons, owner)
    }

    fn with(
        names: Arc<[String]>,
        stages: Vec<Box<dyn Running>>,
        reasons: &'static [&'static str],
        owner: BTreeMap<String, usize>,
    ) -> Chain {
        let mut reason_base = Vec::new();
        let mut at = 0u8;
        for stage in &stages {
            reason_base.push(at);
            at += stage.drop_reasons().len() as u8;
        }
        Chain {
            names,
            stages,
            reason_base,
            reasons,
            owner,
        }
    }

    fn stage_of(&self, name: &str) -> Result<usize, ControlError> {
        self.owner
            .get(name)
            .copied()
            .ok_or_else(|| ControlError::UnknownTable {
                name: name.to_string(),
                known: self.owner.keys().cloned().collect(),
            })
    }
}

/// Whether a packet goes on to the next stage.
fn passed(v: Verdict) -> bool {
    matches!(v, Verdict::Forward(_) | Verdict::Flood)
}

/// Renames stage drop reasons into the chain's: the stage's `i`-th is the chain's
/// `base + i`-th.
fn rebase(burst: &mut Burst, base: u8) {
    for d in burst.descs_mut() {
        if let Verdict::Drop(DropReason(code)) = d.verdict
            && code >= DropReason::PROGRAM_BASE
        {
            d.verdict = Verdict::Drop(DropReason(code + base));
        }
    }
}

/// Each stage syncs what it tracks (stages declare distinct names).
impl crate::synced_parts::SyncedParts for Chain {
    fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
        self.stages.iter().for_each(|s| f(s));
    }

    fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
        self.stages.iter_mut().for_each(|s| f(s));
    }
}

impl Program for Chain {
    /// What the stage the request is for prepared.
    type Prepared = Prepared;

    fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
        for (i, stage) in self.stages.iter_mut().enumerate() {
            let base = self.reason_base[i];
            if i == 0 {
                stage.process(burst, ctx);
                rebase(burst, base);
            } else {
                burst.with_only(
                    |d| passed(d.verdict),
                    |part| {
                        stage.process(part, ctx);
                        rebase(part, base);
                    },
                );
            }
        }
    }

    fn poll(&mut self, out: &mut Burst, ctx: &mut Context) {
        for stage in &mut self.stages {
            stage.poll(out, ctx);
        }
    }

    fn drop_reasons(&self) -> &'static [&'static str] {
        self.reasons
    }

    fn check_workers(&self, workers: usize, live: bool) -> Result<(), String> {
        (self.stages.iter()).try_for_each(|s| s.check_workers(workers, live))
    }

    /// As the first stage that asks for a port's steering says: a flow's two directions
    /// reach one worker under any steering, so the other stages keep their flows. (Only
    /// `nat` asks, and a chain cannot hold two: both would declare `translations`.)
    fn steering(&self, port: PortId) -> Steering {
        (self.stages.iter())
            .map(|s| s.steering(port))
            .find(|s| *s != Steering::Flow)
            .unwrap_or_default()
    }

    fn declarations(&self) -> Vec<Declaration> {
        self.stages.iter().flat_map(|s| s.declarations()).collect()
    }

    crate::synced_parts::synced_parts_methods!();

    fn prepare(&self, request: &Request) -> Result<Option<Arc<Prepared>>, ControlError> {
        let stage = &self.stages[self.stage_of(request.target())?];
        Ok(stage.prepare(request)?.map(Arc::new))
    }

    fn control(
        &mut self,
        request: &Request,
        prepared: Option<&Arc<Prepared>>,
        ctx: &Context,
    ) -> Result<Reply, ControlError> {
        let i = self.stage_of(request.target())?;
        self.stages[i].control(request, prepared.map(|p| p.as_ref()), ctx)
    }

    fn notifications(&mut self, out: &mut Vec<Notification>) {
        for stage in &mut self.stages {
            stage.notifications(out);
        }
    }

    /// Stage by stage: each takes what it can of the old chain's stage of the same
    /// program, wherever it stood; the state of a stage that left the chain is left
    /// behind.
    fn inherit(&mut self, old: Self, now_ns: u64) -> Vec<Carried> {
        let mut old: Vec<(String, Option<Box<dyn Running>>)> = (old.names.iter().cloned())
            .zip(old.stages.into_iter().map(Some))
            .collect();
        let mut carried = Vec::new();
        for (name, stage) in self.names.iter().zip(&mut self.stages) {
            if let Some(was) = old
                .iter_mut()
                .find(|(n, _)| n == name)
                .and_then(|o| o.1.take())
            {
                carried.extend(stage.inherit(was, now_ns));
            }
        }
        for gone in old.into_iter().filter_map(|(_, stage)| stage) {
            carried.extend(
                (gone.declarations().iter())
                    .map(|d| Carried::afresh(&d.name, "its stage left the chain")),
            );
        }
        carried
    }
}

/// The drop-reason names `reasons` as the `Program` trait hands them out (`'static`). Each
/// list of names is made once per process and kept: a reload that names the same reasons
/// again (as most do) gets the same list rather than leaking another.
fn interned(reasons: Vec<String>) -> &'static [&'static str] {
    type Lists = BTreeMap<Vec<String>, &'static [&'static str]>;
    static LISTS: std::sync::Mutex<Lists> = std::sync::Mutex::new(BTreeMap::new());
    let mut lists = LISTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    if let Some(&list) = lists.get(&reasons) {
        return list;
    }
    let list: &'static [&'static str] = Box::leak(
        (reasons.iter())
            .map(|r| &*Box::leak(r.clone().into_boxed_str()))
            .collect::<Vec<&'static str>>()
            .into_boxed_slice(),
    );
    lists.insert(reasons, list);
    list
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testutil::{hasher, ip_frame, run_at, tcp};
    use stateplane_state::Reply;

    const CHAIN: &str = r#"
stages = ["acl", "nat", "router"]
[acl]
default = "permit"
rules = [{ action = "deny", proto = "tcp", dst_ports = "23" }]
[nat]
external = "198.18.255.1"
capacity = 64
inside = "inside"
outside = "outside"
[router]
routes = [
  { prefix = "198.19.0.0/16", port = "outside", next_hop_mac = "02:00:00:00:0b:01" },
  { prefix = "198.18.0.0/24", port = "inside", next_hop_mac = "02:00:00:00:0a:01" },
]
"#;

    fn names() -> PortNames {
        PortNames(vec!["inside".into(), "outside".into()])
    }

    fn chain(text: &str) -> Result<Box<dyn Running>, ConfigError> {
        let table: toml::Value = toml::from_str(text).unwrap();
        Ok(crate::build("chain", Some(&table), &names())?(0))
    }

    fn reason(p: &dyn Running, v: Verdict) -> &'static str {
        match v {
            Verdict::Drop(r) => r.name(p.drop_reasons()),
            _ => "pass",
        }
    }

    /// Runs frames through a boxed program (the test helper wants a sized one).
    struct Boxed(Box<dyn Running>);

    impl Program for Boxed {
        type Prepared = ();

        fn process(&mut self, burst: &mut Burst, ctx: &mut Context) {
            self.0.process(burst, ctx);
        }

        crate::synced_parts::synced_parts_methods!();
    }

    impl crate::synced_parts::SyncedParts for Boxed {
        fn synced_views(&self, f: &mut dyn FnMut(&dyn crate::synced_parts::SyncedView)) {
            f(&self.0);
        }

        fn synced_parts(&mut self, f: &mut dyn FnMut(&mut dyn crate::synced_parts::SyncedPart)) {
            f(&mut self.0);
        }
    }

    /// A chain built again from the same configuration (a reload) reuses the drop-reason
    /// names of the first build instead of leaking a new list.
    #[test]
    fn rebuilding_a_chain_reuses_its_drop_reason_names() {
        let first = chain(CHAIN).unwrap().drop_reasons();
        let again = chain(CHAIN).unwrap().drop_reasons();
        assert!(first.contains(&"nat.no_translation"), "{first:?}");
        assert!(std::ptr::eq(first, again));
        let other = chain("stages = [\"acl\"]\n[acl]\ndefault = \"permit\"\n")
            .unwrap()
            .drop_reasons();
        assert!(!std::ptr::eq(first, other));
        assert!(other.iter().all(|r| r.starts_with("acl.")), "{other:?}");
    }

    /// A reload hands each stage the old chain's stage of the same program, wherever it
    /// stood: the NAT keeps its translation with the ACL gone from before it; a stage that
    /// left, and a program of another type, say that their state starts afresh.
    #[test]
    fn a_reload_keeps_each_stages_state_by_its_program() {
        let syn = ip_frame("198.18.0.5", "198.19.0.9", tcp(40_000, 80, 0x02));
        let answer = ip_frame("198.19.0.9", "198.18.255.1", tcp(80, 40_000, 0x12));
        let mut old = Boxed(chain(CHAIN).unwrap());
        assert_eq!(
            run_at(&mut old, 1, &[(syn, 0)], (0, 1), 2)[0].0,
            Verdict::Forward(1)
        );
        let without_acl = CHAIN
            .replace(
                r#"stages = ["acl", "nat", "router"]"#,
                r#"stages = ["nat", "router"]"#,
            )
            .replace(
                "[acl]\ndefault = \"permit\"\nrules = [{ action = \"deny\", proto = \"tcp\", \
                 dst_ports = \"23\" }]\n",
                "",
            );
        let mut new = Boxed(chain(&without_acl).unwrap());
        let said: Vec<String> = (new.0.inherit(old.0, 1).iter())
            .map(|c| c.to_string())
            .collect();
        assert!(
            said.contains(&"translations: kept 1 entries".to_string()),
            "{said:?}"
        );
        assert!(said.contains(&"routes4: made again from the configuration".to_string()));
        assert!(said.contains(&"rules: starts afresh (its stage left the chain)".to_string()));
        let out = run_at(&mut new, 2, &[(answer, 1)], (0, 1), 2);
        assert_eq!(
            out[0].0,
            Verdict::Forward(0),
            "answered through the kept translation"
        );
        // Another program in the chain's place: nothing of the chain's can come across.
        let nat = crate::build("nat", Some(&toml::from_str(CHAIN_NAT).unwrap()), &names());
        let said: Vec<String> = (nat.unwrap()(0).inherit(chain(CHAIN).unwrap(), 1).iter())
            .map(|c| c.to_string())
            .collect();
        assert!(
            said.contains(&"translations: starts afresh (the reload changed the program)".into()),
            "{said:?}"
        );
    }

    /// Each stage syncs its own state under the ids the run gives it: acl's counters and
    /// nat's translations side by side, a translation moving into another chain whole
    /// (another hash seed) and a counter written alone.
    #[test]
    fn each_stage_syncs_its_own_state() {
        let syn = ip_frame("198.18.0.5", "198.19.0.9", tcp(40_000, 80, 0x02));
        let answer = ip_frame("198.19.0.9", "198.18.255.1", tcp(80, 40_000, 0x12));
        let mut a = Boxed(chain(CHAIN).unwrap());
        let mut b = Boxed(chain(CHAIN).unwrap());
        let translations = a.0.track("translations", 0).unwrap();
        assert_eq!(b.0.track("translations", 0), Some(translations));
        let cells = a.0.declarations()[1].capacity as u32;
        assert_eq!(a.0.track("rule_packets", 1), Some(cells));
        assert_eq!(a.0.track("routes4", 2), None, "the control plane's");
        assert_eq!(a.0.synced(), [(0, translations), (1, cells)]);
        run_at(&mut a, 1, &[(syn, 0)], (0, 1), 2);
        let declared = a.0.declarations();
        let translations_declared = declared.iter().find(|d| d.name == "translations");
        let stride =
            stateplane_state::synced_table::SlotWords::of(translations_declared.unwrap(), &[])
                .unwrap()
                .stride() as u32;
        let (moved, refused) = crate::testutil::move_synced_state(&mut a, &mut b, 0, stride);
        assert_eq!((moved, refused), (1, 0));
        assert_eq!(
            run_at(&mut b, 2, &[(answer, 1)], (0, 1), 2)[0].0,
            Verdict::Forward(0),
            "answered through the moved translation"
        );
        let default = cells - 1;
        assert_eq!(
            a.0.read_synced(1, default),
            Some(1),
            "the SYN, by the default"
        );
        assert_eq!(a.0.write_synced(1, default, 7), Some(1));
        let mut changes = Vec::new();
        assert!(a.0.changes(&mut changes, usize::MAX));
        let taken: Vec<_> = changes.iter().map(|c| (c.state, c.index, c.new)).collect();
        assert_eq!(taken, [(1, default, 7)], "the counter alone");
    }

    const CHAIN_NAT: &str = r#"
external = "198.18.255.1"
inside = "inside"
outside = "outside"
"#;

    #[test]
    fn acl_then_nat_then_router_each_see_what_the_one_before_passed() {
        let mut p = Boxed(chain(CHAIN).unwrap());
        let out = run_at(
            &mut p,
            1,
            &[
                (
                    ip_frame("198.18.0.5", "198.19.0.9", tcp(40_000, 80, 0x02)),
                    0,
                ),
                (
                    ip_frame("198.18.0.5", "198.19.0.9", tcp(40_001, 23, 0x02)),
                    0,
                ),
            ],
            (0, 1),
            2,
        );
        // Permitted, translated, routed: from the external address, to the next hop's MAC.
        assert_eq!(out[0].0, Verdict::Forward(1));
        let key = stateplane_wire::parse(&out[0].1, 0, &hasher()).unwrap().key;
        assert_eq!(key.src_ip(), Some("198.18.255.1".parse().unwrap()));
        assert_eq!(out[0].1[..6], [2, 0, 0, 0, 0x0b, 1]);
        assert_eq!(out[0].1[22], 63, "the router took one off the TTL");
        // Denied by the first stage, under its name; the NAT never saw it.
        assert_eq!(reason(p.0.as_ref(), out[1].0), "acl.denied");
        let read = Request::Read {
            table: "translations".into(),
            key: None,
            from: 0,
        };
        let ctx = crate::testutil::ctx(1, 2);
        match p.0.control(&read, None, &ctx).unwrap() {
            Reply::Page(entries, _) => assert_eq!(entries.len(), 1, "only the permitted one"),
            other => panic!("{other:?}"),
        }
        // The answer comes back through all three, to the inside host.
        let answer = ip_frame("198.19.0.9", "198.18.255.1", tcp(80, 40_000, 0x12));
        let out = run_at(&mut p, 2, &[(answer, 1)], (0, 1), 2);
        assert_eq!(out[0].0, Verdict::Forward(0));
        let key = stateplane_wire::parse(&out[0].1, 0, &hasher()).unwrap().key;
        assert_eq!(key.dst_ip(), Some("198.18.0.5".parse().unwrap()));
        // An unsolicited packet: the NAT's drop, named as the NAT's.
        let stray = ip_frame("198.19.0.9", "198.18.255.1", tcp(80, 41_000, 0x02));
        let out = run_at(&mut p, 3, &[(stray, 1)], (0, 1), 2);
        assert_eq!(reason(p.0.as_ref(), out[0].0), "nat.no_translation");
        // Control-plane requests reach the stage that declares the name.
        let unknown = Request::Read {
            table: "nothing".into(),
            key: None,
            from: 0,
        };
        match p.0.control(&unknown, None, &ctx) {
            Err(ControlError::UnknownTable { known, .. }) => {
                assert!(known.contains(&"routes4".to_string()), "{known:?}");
                assert!(known.contains(&"rules".to_string()), "{known:?}");
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn bad_chains_name_the_field_and_the_fix() {
        let field = |text: &str| chain(text).err().map(|e| e.field).unwrap_or_default();
        assert_eq!(field("stages = []"), "program.chain.stages");
        assert_eq!(field("stages = [\"acl\", \"acl\"]"), "program.chain.stages");
        assert_eq!(
            field("stages = [\"acl\"]\n[nat]\nexternal = \"1.2.3.4\""),
            "program.chain.nat"
        );
        assert_eq!(
            field("stages = [\"nat\"]\n[nat]\nexternal = \"x\""),
            "program.chain.nat.external",
            "a stage's own field, inside the chain"
        );
        let twice = chain("stages = [\"conntrack\", \"firewall\"]")
            .err()
            .unwrap();
        assert!(twice.problem.contains("`connections`"), "{twice}");
        assert_eq!(field("stages = [\"teleport\"]"), "program.chain.program");
        // A missing setting says where the settings go, inside the chain or not.
        let missing = chain("stages = [\"nat\"]").err().unwrap();
        assert_eq!(missing.field, "program.chain.nat");
        assert!(
            missing.problem.contains("`[program.chain.nat]`"),
            "{missing}"
        );
        let alone = crate::build("lb", None, &names()).err().unwrap();
        assert!(alone.problem.contains("`[program.lb]` table"), "{alone}");
    }
}
