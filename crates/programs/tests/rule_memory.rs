//! What a pipeline's rules take, measured by the allocator, against what the run's memory
//! budget is told ([`Pipeline::bytes_for_rules`]): the budget must never be told less.

#![allow(clippy::unwrap_used)]

use stateplane_mem::counting::{Counting, assert_told_enough, held_by};
use stateplane_programs::PortNames;
use stateplane_programs::pipeline::{ACTIONS_IN_A_RULE, BYTES_AN_ACTION, Pipeline, PipelineConfig};

#[global_allocator]
static ALLOCATOR: Counting = Counting;

fn pipeline(rules: &[String]) -> Pipeline {
    let cfg = PipelineConfig {
        tables: 2,
        rules: rules.to_vec(),
        cache_entries: 1024,
        ..toml::from_str("").unwrap()
    };
    let ports = PortNames((0..4).map(|p| format!("p{p}")).collect());
    Pipeline::new(&cfg, &ports, "program.pipeline").unwrap()
}

/// The text of a shape's `i`th rule.
type RuleText = fn(usize) -> String;

#[test]
fn the_budget_is_told_at_least_what_rules_take() {
    let shapes: [(&str, RuleText); 6] = [
        ("five-tuple with ranges", |i| {
            format!(
                "priority={},tcp,nw_src=198.18.{}.{}/32,nw_dst=198.19.0.0/16,tp_dst={}-{},actions=output:1",
                i % 60_000,
                i / 256 % 256,
                i % 256,
                i % 1000,
                i % 1000 + 10
            )
        }),
        ("exact MAC, several actions", |i| {
            format!(
                "table=1,dl_dst=02:00:00:{:02x}:{:02x}:{:02x},actions=mod_vlan_vid:{},mod_dl_src:02:00:00:00:00:01,output:2,output:3",
                i >> 16 & 0xff,
                i >> 8 & 0xff,
                i & 0xff,
                i % 4000 + 1
            )
        }),
        ("prefixes over many masks", |i| {
            format!(
                "priority={},ip,nw_dst=198.{}.{}.0/{},actions=goto_table:1",
                i % 60_000,
                18 + i % 2,
                i % 256,
                8 + i % 17
            )
        }),
        ("a mask pair of its own each (1,089 tuples)", |i| {
            format!(
                "priority={},ip,nw_src=198.18.{}.0/{},nw_dst=198.19.{}.0/{},actions=output:0,dec_ttl",
                i % 60_000,
                i / 33 % 256,
                i % 33,
                i / 1089 % 256,
                i / 33 % 33
            )
        }),
        (
            "bits of MACs of their own (the decision tree's most copies)",
            |i| {
                let bits = |seed: usize| {
                    let b = (seed as u64 + 1)
                        .wrapping_mul(0x9e37_79b9_7f4a_7c15)
                        .to_be_bytes();
                    b[2..]
                        .iter()
                        .map(|o| format!("{o:02x}"))
                        .collect::<Vec<_>>()
                        .join(":")
                };
                format!(
                    "priority={},dl_src={}/{},dl_dst={}/{},actions=output:0",
                    i % 60_000,
                    bits(i * 4),
                    bits(i * 4 + 1),
                    bits(i * 4 + 2),
                    bits(i * 4 + 3)
                )
            },
        ),
        ("twelve actions", |i| {
            format!(
                "priority={},udp,tp_src={},actions=dec_ttl,mod_tp_dst:53,mod_nw_dst:198.19.0.1,mod_dl_dst:02:00:00:00:00:09,mod_vlan_vid:7,strip_vlan,mod_tp_src:9,output:0,output:1,output:2,output:3,dec_ttl",
                i % 60_000,
                i % 65_536
            )
        }),
    ];
    for (shape, rule) in shapes {
        for n in [1, 100, 897, 1_000, 7_169, 57_345] {
            let (empty, base) = held_by(|| pipeline(&[]));
            drop(empty);
            let texts: Vec<String> = (0..n).map(rule).collect();
            let actions = |t: &String| {
                t.split("actions=")
                    .nth(1)
                    .map_or(0, |a| a.split(',').count())
            };
            let extra: usize = (texts.iter())
                .map(|t| actions(t).saturating_sub(ACTIONS_IN_A_RULE))
                .sum();
            let told = Pipeline::bytes_for_rules(n, 2) + BYTES_AN_ACTION * extra as u64;
            let (full, bytes) = held_by(|| pipeline(&texts));
            let what = format!("{shape}, {n} rules");
            assert_told_enough(&what, told, bytes - base, 4);
            drop(full);
        }
    }
}
