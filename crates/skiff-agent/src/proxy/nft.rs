//! Applies [`rules`](super::rules) to the kernel: each change is one nftables
//! transaction (applied whole or not at all). Two writers: skiff's own
//! netlink batches ([`super::netlink`], the default: no process, no listing
//! of the kernel's tables first) and `nft -j -f -` fed JSON built with the
//! `nftables` crate's schema (`SKIFF_NFT_BACKEND=nft`; it programs
//! [`rules::Shape::Rules`], as nft 1.0's JSON cannot declare the endpoint
//! maps of [`rules::Shape::Maps`]). Only skiff's own tables are ever
//! named. Stale UDP conntrack entries are deleted with the `conntrack` tool
//! (conntrack-tools), as no maintained crate speaks ctnetlink deletion.

use std::borrow::Cow;
use std::collections::HashSet;
use std::net::Ipv4Addr;

use nftables::expr::{
    BinaryOperation, Expression, Fib, FibFlag, FibResult, Meta, MetaKey, NamedExpression, NgMode,
    Numgen, Payload, PayloadField, Prefix, SetItem, Verdict as NfVerdict, CT,
};
use nftables::schema::{
    Chain, Element, FlushObject, NfCmd, NfListObject, NfObject, Rule as NfRule, Set, SetFlag,
    SetType, SetTypeValue, Table,
};
use nftables::stmt::{
    JumpTarget, Mangle, Match, NATFamily, NATFlag, Operator, Reject, RejectType, Statement,
    VerdictMap, NAT,
};
use nftables::types::{NfChainType, NfFamily, NfHook};
use serde_json::{json, Value};

use super::netlink;
use super::rules::{self, Home, MapKey, Op, PortRules, Rule, Verdict};

/// Why a transaction failed; retryable (the kernel kept the previous rules).
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("nft refused the transaction: {0}")]
    TransactionFailed(String),
    #[error("running nft: {0}")]
    NftUnavailable(String),
}

/// How transactions reach the kernel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// skiff's own netlink batches ([`super::netlink`]): no process, no
    /// listing of the kernel's tables first.
    Netlink,
    /// `nft -j -f -` with the JSON of the same objects.
    Binary,
}

impl Backend {
    /// `SKIFF_NFT_BACKEND=nft` selects the `nft` binary; netlink otherwise.
    pub fn from_env() -> Backend {
        match std::env::var("SKIFF_NFT_BACKEND").as_deref() {
            Ok("nft") | Ok("binary") => Backend::Binary,
            _ => Backend::Netlink,
        }
    }
}

impl Backend {
    /// The ruleset shape this writer can program ([`rules::Shape`]).
    pub fn shape(self) -> rules::Shape {
        match self {
            Backend::Netlink => rules::Shape::Maps,
            Backend::Binary => rules::Shape::Rules,
        }
    }
}

/// skiff's table in the kernel.
#[derive(Debug, Clone)]
pub struct Nft {
    table: String,
    backend: Backend,
    cluster_cidr: Option<(Ipv4Addr, u8)>,
}

impl Nft {
    /// skiff's tables named after `table`, written by the backend the
    /// environment selects ([`Backend::from_env`]).
    pub fn new(table: &str) -> Nft {
        Nft::with_backend(table, Backend::from_env())
    }

    pub fn with_backend(table: &str, backend: Backend) -> Nft {
        Nft {
            table: table.to_string(),
            backend,
            cluster_cidr: None,
        }
    }

    /// The cluster's pod range: each shard marks ClusterIP traffic from
    /// outside it for masquerading (the services' `cluster-ips` elements).
    pub fn with_cluster_cidr(mut self, cidr: Option<(Ipv4Addr, u8)>) -> Nft {
        self.cluster_cidr = cidr;
        self
    }

    pub fn backend(&self) -> Backend {
        self.backend
    }

    pub fn table(&self) -> &str {
        &self.table
    }

    /// The name of the table `home` in the kernel: the main table, or
    /// `<main>-svc<i>` for a service shard.
    pub fn table_of(&self, home: Home) -> String {
        shard_table(&self.table, home)
    }

    /// Replaces the whole of skiff's tables (skeletons, node addresses,
    /// every service, each in its home) in one transaction: existing
    /// connections keep their conntrack state.
    pub async fn replace_all(
        &self,
        node_ips: &[Ipv4Addr],
        services: &[(Home, &PortRules)],
    ) -> Result<(), Error> {
        if self.backend == Backend::Netlink {
            return self.replace_all_netlink(node_ips, services).await;
        }
        if services.iter().any(|(_, s)| !s.dnat_maps.is_empty()) {
            return Err(no_maps_in_json());
        }
        let endpoints: std::collections::BTreeSet<Ipv4Addr> = services
            .iter()
            .flat_map(|(_, s)| s.endpoints.iter().copied())
            .collect();
        let mut objs = vec![];
        let homes = std::iter::once(Home::Main).chain((0..rules::SHARDS).map(Home::Shard));
        for home in homes {
            let name = self.table_of(home);
            let table = NfListObject::Table(Table {
                family: NfFamily::IP,
                name: Cow::Owned(name.clone()),
                handle: None,
            });
            objs.push(cmd(NfCmd::Add(table.clone())));
            objs.push(cmd(NfCmd::Delete(table.clone())));
            objs.push(cmd(NfCmd::Add(table)));
            let (maps, skeleton) = match home {
                Home::Main => (&rules::MAPS[..], rules::skeleton()),
                Home::Shard(_) => (
                    &rules::SHARD_MAPS[..],
                    rules::shard_skeleton(self.cluster_cidr),
                ),
            };
            for (map, by_ip) in maps {
                let key = if *by_ip {
                    json!(["ipv4_addr", "inet_proto", "inet_service"])
                } else {
                    json!(["inet_proto", "inet_service"])
                };
                // The crate's set types have no `verdict`, so the maps are
                // declared as raw JSON of the same schema.
                objs.push(json!({"add": {"map": {
                    "family": "ip", "table": name, "name": map,
                    "type": key, "map": "verdict",
                }}}));
            }
            if home == Home::Main {
                for map in [
                    super::policy::model::POLICY_INGRESS,
                    super::policy::model::POLICY_EGRESS,
                ] {
                    objs.push(json!({"add": {"map": {
                        "family": "ip", "table": name, "name": map,
                        "type": "ipv4_addr", "map": "verdict",
                    }}}));
                }
                objs.push(cmd(NfCmd::Add(NfListObject::Set(Box::new(Set {
                    family: NfFamily::IP,
                    table: Cow::Owned(name.clone()),
                    name: Cow::Borrowed(rules::HAIRPIN),
                    set_type: SetTypeValue::Concatenated(Cow::Borrowed(&[
                        SetType::Ipv4Addr,
                        SetType::Ipv4Addr,
                    ])),
                    size: Some(rules::hairpin_capacity(endpoints.len())),
                    ..Default::default()
                })))));
            }
            // Both kinds of table match NodePorts on the node's addresses.
            objs.push(cmd(NfCmd::Add(NfListObject::Set(Box::new(Set {
                family: NfFamily::IP,
                table: Cow::Owned(name.clone()),
                name: Cow::Borrowed(rules::NODEPORT_IPS),
                set_type: SetTypeValue::Single(SetType::Ipv4Addr),
                elem: (!node_ips.is_empty()).then(|| {
                    Cow::Owned(
                        node_ips
                            .iter()
                            .map(|ip| Expression::String(Cow::Owned(ip.to_string())))
                            .collect(),
                    )
                }),
                ..Default::default()
            })))));
            for (chain_name, hook, _) in &skeleton {
                let mut chain = chain(&name, chain_name);
                if let Some(h) = hook {
                    chain._type = Some(if h.nat {
                        NfChainType::NAT
                    } else {
                        NfChainType::Filter
                    });
                    chain.hook = Some(match h.hook {
                        "prerouting" => NfHook::Prerouting,
                        "input" => NfHook::Input,
                        "forward" => NfHook::Forward,
                        "output" => NfHook::Output,
                        _ => NfHook::Postrouting,
                    });
                    chain.prio = Some(h.priority);
                }
                objs.push(cmd(NfCmd::Add(NfListObject::Chain(chain))));
            }
            for (chain_name, _, rules) in skeleton {
                for r in rules {
                    objs.push(self.op(home, &Op::AddRule(chain_name.to_string(), r)));
                }
            }
        }
        let empty = PortRules::default();
        for (owner, s) in services {
            for op in rules::diff(&empty, s) {
                objs.push(self.op(op.home(*owner), &op));
            }
        }
        for ip in endpoints {
            objs.push(self.op(Home::Main, &Op::AddHairpin(ip)));
        }
        self.run(objs).await
    }

    /// Applies `ops` (each with the home of the service it belongs to) in
    /// one transaction (nothing to do for none).
    pub async fn apply(&self, ops: &[(Home, Op)]) -> Result<(), Error> {
        if ops.is_empty() {
            return Ok(());
        }
        if self.backend == Backend::Netlink {
            let tagged: Vec<(String, Op)> = ops
                .iter()
                .map(|(owner, o)| (self.table_of(o.home(*owner)), o.clone()))
                .collect();
            let mut batch = netlink::Batch::new();
            if tagged.len() > 1000 {
                batch.quiet();
            }
            netlink::encode_ops(&mut batch, &tagged);
            return send_batch(batch).await;
        }
        if ops.iter().any(|(_, o)| matches!(o, Op::AddDnatMap(..))) {
            return Err(no_maps_in_json());
        }
        let objs = ops
            .iter()
            .map(|(owner, o)| self.op(o.home(*owner), o))
            .collect();
        self.run(objs).await
    }

    /// [`Nft::replace_all`] as one netlink batch: every table deleted and
    /// re-created with its contents (the kernel swaps them in one commit,
    /// so established connections keep their NAT state and new ones never
    /// see a missing table).
    async fn replace_all_netlink(
        &self,
        node_ips: &[Ipv4Addr],
        services: &[(Home, &PortRules)],
    ) -> Result<(), Error> {
        let endpoints: Vec<Ipv4Addr> = services
            .iter()
            .flat_map(|(_, s)| s.endpoints.iter().copied())
            .collect::<std::collections::BTreeSet<_>>()
            .into_iter()
            .collect();
        let mut batch = netlink::Batch::new();
        if services.len() > 100 {
            batch.quiet();
        }
        let homes = std::iter::once(Home::Main).chain((0..rules::SHARDS).map(Home::Shard));
        for home in homes {
            let name = self.table_of(home);
            batch.add_table(&name);
            batch.delete_table(&name);
            batch.add_table(&name);
            netlink::encode_skeleton(
                &mut batch,
                &name,
                home,
                node_ips,
                self.cluster_cidr,
                rules::hairpin_capacity(endpoints.len()),
            );
        }
        let empty = PortRules::default();
        let mut ops: Vec<(String, Op)> = vec![];
        for (owner, s) in services {
            for op in rules::diff(&empty, s) {
                ops.push((self.table_of(op.home(*owner)), op));
            }
        }
        // Sets, chains and rules first (rules keep their order), then the
        // map elements grouped by map, so each map gets few messages.
        fn group(x: &(String, Op)) -> (u8, &str, &str) {
            match &x.1 {
                Op::AddElement(m, ..) => (x.1.phase(), x.0.as_str(), m),
                o => (o.phase(), "", ""),
            }
        }
        ops.sort_by(|a, b| group(a).cmp(&group(b)));
        netlink::encode_ops(&mut batch, &ops);
        if !endpoints.is_empty() {
            batch.hairpin(&self.table_of(Home::Main), &endpoints, false);
        }
        tracing::debug!(
            messages = batch.messages(),
            bytes = batch.len(),
            "full load as one netlink batch"
        );
        send_batch(batch).await
    }

    async fn run(&self, objs: Vec<Value>) -> Result<(), Error> {
        let payload = json!({"nftables": objs}).to_string();
        tokio::task::spawn_blocking(move || run_nft(&payload))
            .await
            .map_err(|e| Error::NftUnavailable(e.to_string()))?
    }

    /// One op, in the table `home`, as nft JSON.
    pub fn op(&self, home: Home, op: &Op) -> Value {
        let table = self.table_of(home);
        let t = table.as_str();
        let c = match op {
            Op::DeleteElement(map, key) => {
                NfCmd::Delete(NfListObject::Element(element(t, map, key_expr(key))))
            }
            Op::AddSet(name, timeout) => {
                let mut s = set(t, name);
                // `dynamic` is implied by the `update` rules (nft 1.0.6 refuses it
                // in JSON).
                s.flags = Some(HashSet::from([SetFlag::Timeout]));
                s.timeout = Some(*timeout);
                NfCmd::Add(NfListObject::Set(Box::new(s)))
            }
            Op::AddChain(name) => NfCmd::Add(NfListObject::Chain(chain(t, name))),
            Op::FlushChain(name) => NfCmd::Flush(FlushObject::Chain(chain(t, name))),
            Op::AddRule(chain, rule) => NfCmd::Add(NfListObject::Rule(NfRule {
                family: NfFamily::IP,
                table: Cow::Owned(table.clone()),
                chain: Cow::Owned(chain.clone()),
                expr: Cow::Owned(statements(rule)),
                ..Default::default()
            })),
            Op::AddElement(map, key, Verdict::Drop) => {
                // The crate writes a bare `drop` verdict as the string
                // "drop", which nft refuses in a map element.
                let key = serde_json::to_value(key_expr(key)).expect("expressions serialize");
                return json!({"add": {"element": {
                    "family": "ip", "table": t, "name": map,
                    "elem": [[key, {"drop": null}]],
                }}});
            }
            Op::AddElement(map, key, verdict) => NfCmd::Add(NfListObject::Element(element(
                t,
                map,
                Expression::List(vec![key_expr(key), verdict_expr(verdict)]),
            ))),
            Op::DeleteChain(name) => NfCmd::Delete(NfListObject::Chain(chain(t, name))),
            Op::DeleteSet(name) => NfCmd::Delete(NfListObject::Set(Box::new(set(t, name)))),
            Op::AddHairpin(ip) => NfCmd::Add(NfListObject::Element(element(
                t,
                rules::HAIRPIN,
                hairpin_elem(*ip),
            ))),
            Op::DeleteHairpin(ip) => NfCmd::Delete(NfListObject::Element(element(
                t,
                rules::HAIRPIN,
                hairpin_elem(*ip),
            ))),
            // Refused before any JSON is built (see `no_maps_in_json`); the
            // elements of such a map are expressible.
            Op::AddDnatMap(..) => unreachable!("endpoint maps are declared over netlink only"),
            Op::FlushDnatMap(m) => NfCmd::Flush(FlushObject::Set(Box::new(set(t, m)))),
            Op::FillDnatMap(m, eps) => {
                let elems: Vec<Value> = eps
                    .iter()
                    .enumerate()
                    .map(|(i, e)| json!([i, {"concat": [e.ip.to_string(), e.port]}]))
                    .collect();
                return json!({"add": {"element": {
                    "family": "ip", "table": t, "name": m, "elem": elems,
                }}});
            }
        };
        cmd(c)
    }
}

/// nft 1.0's JSON cannot declare an endpoint map (a numgen `integer` key
/// crashes it, and it takes no concatenated data type): the `nft` writer
/// programs [`rules::Shape::Rules`] instead.
fn no_maps_in_json() -> Error {
    Error::TransactionFailed(
        "endpoint maps (rules::Shape::Maps) can only be written over netlink".into(),
    )
}

/// Sends a netlink batch (off the async threads: the kernel commits it
/// within the send).
async fn send_batch(batch: netlink::Batch) -> Result<(), Error> {
    let (bytes, what) = batch.finish();
    tokio::task::spawn_blocking(move || netlink::send(&bytes, &what))
        .await
        .map_err(|e| Error::NftUnavailable(e.to_string()))?
        .map_err(|e| match e {
            netlink::SendError::Refused(m) => Error::TransactionFailed(m),
            netlink::SendError::Io(e) => Error::NftUnavailable(format!("netlink: {e}")),
        })
}

/// The kernel name of the table `home` of skiff's table `main`.
pub fn shard_table(main: &str, home: Home) -> String {
    match home {
        Home::Main => main.to_string(),
        Home::Shard(i) => format!("{main}-svc{i}"),
    }
}

/// The main table and every shard of it.
pub fn all_tables(main: &str) -> Vec<String> {
    std::iter::once(Home::Main)
        .chain((0..rules::SHARDS).map(Home::Shard))
        .map(|h| shard_table(main, h))
        .collect()
}

fn chain(table: &str, name: &str) -> Chain<'static> {
    Chain {
        family: NfFamily::IP,
        table: Cow::Owned(table.to_string()),
        name: Cow::Owned(name.to_string()),
        ..Default::default()
    }
}

fn set(table: &str, name: &str) -> Set<'static> {
    Set {
        family: NfFamily::IP,
        table: Cow::Owned(table.to_string()),
        name: Cow::Owned(name.to_string()),
        set_type: SetTypeValue::Single(SetType::Ipv4Addr),
        ..Default::default()
    }
}

fn element(table: &str, map: &str, elem: Expression<'static>) -> Element<'static> {
    Element {
        family: NfFamily::IP,
        table: Cow::Owned(table.to_string()),
        name: Cow::Owned(map.to_string()),
        elem: Cow::Owned(vec![elem]),
    }
}

fn cmd(c: NfCmd<'_>) -> Value {
    serde_json::to_value(NfObject::CmdObject(c)).expect("nftables objects serialize")
}

fn s(v: impl Into<String>) -> Expression<'static> {
    Expression::String(Cow::Owned(v.into()))
}

fn payload(protocol: &'static str, field: &'static str) -> Expression<'static> {
    Expression::Named(NamedExpression::Payload(Payload::PayloadField(
        PayloadField {
            protocol: Cow::Borrowed(protocol),
            field: Cow::Borrowed(field),
        },
    )))
}

fn meta(key: MetaKey) -> Expression<'static> {
    Expression::Named(NamedExpression::Meta(Meta { key }))
}

fn matches(
    left: Expression<'static>,
    op: Operator,
    right: Expression<'static>,
) -> Statement<'static> {
    Statement::Match(Match { left, right, op })
}

fn prefix((ip, len): (Ipv4Addr, u8)) -> Expression<'static> {
    Expression::Named(NamedExpression::Prefix(Prefix {
        addr: Box::new(s(ip.to_string())),
        len: len as u32,
    }))
}

fn target(c: &str) -> JumpTarget<'static> {
    JumpTarget {
        target: Cow::Owned(c.to_string()),
    }
}

fn fib_saddr_local() -> Statement<'static> {
    matches(
        Expression::Named(NamedExpression::Fib(Fib {
            result: FibResult::Type,
            flags: HashSet::from([FibFlag::Saddr]),
        })),
        Operator::EQ,
        s("local"),
    )
}

fn mark() -> Expression<'static> {
    meta(MetaKey::Mark)
}

/// `numgen random mod k == 0` (nothing for k ≤ 1: the last pick).
fn pick(k: u32) -> Vec<Statement<'static>> {
    if k <= 1 {
        return vec![];
    }
    vec![matches(
        Expression::Named(NamedExpression::Numgen(Numgen {
            mode: NgMode::Random,
            ng_mod: k,
            offset: None,
        })),
        Operator::EQ,
        Expression::Number(0),
    )]
}

fn hairpin_elem(ip: Ipv4Addr) -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(vec![
        s(ip.to_string()),
        s(ip.to_string()),
    ]))
}

fn key_expr(k: &MapKey) -> Expression<'static> {
    match k {
        MapKey::Ip(ip, p, port) => Expression::Named(NamedExpression::Concat(vec![
            s(ip.to_string()),
            s(p.nft()),
            Expression::Number(*port as u32),
        ])),
        MapKey::NodePort(p, port) => Expression::Named(NamedExpression::Concat(vec![
            s(p.nft()),
            Expression::Number(*port as u32),
        ])),
        MapKey::Addr(ip) => s(ip.to_string()),
    }
}

fn verdict_expr(v: &Verdict) -> Expression<'static> {
    match v {
        Verdict::Goto(c) => Expression::Verdict(NfVerdict::Goto(target(c))),
        Verdict::Jump(c) => Expression::Verdict(NfVerdict::Jump(target(c))),
        Verdict::Drop => Expression::Verdict(NfVerdict::Drop),
    }
}

fn daddr_proto_port() -> Expression<'static> {
    Expression::Named(NamedExpression::Concat(vec![
        payload("ip", "daddr"),
        meta(MetaKey::L4proto),
        payload("th", "dport"),
    ]))
}

/// A rule's statements in the crate's schema.
pub fn statements(r: &Rule) -> Vec<Statement<'static>> {
    let mark_for_masq = Statement::Jump(target(rules::MARK_FOR_MASQ));
    match r {
        Rule::Jump(c) => vec![Statement::Jump(target(c))],
        Rule::Goto(c) => vec![Statement::Goto(target(c))],
        Rule::Drop => vec![Statement::Drop(None)],
        Rule::JumpIfNew(c) => vec![
            matches(
                Expression::Named(NamedExpression::CT(CT {
                    key: Cow::Borrowed("state"),
                    family: None,
                    dir: None,
                })),
                Operator::IN,
                s("new"),
            ),
            Statement::Jump(target(c)),
        ],
        Rule::DaddrProtoPortVmap(m) => vec![Statement::VerdictMap(VerdictMap {
            key: daddr_proto_port(),
            data: s(format!("@{m}")),
        })],
        Rule::NodePortVmap(m) => vec![
            matches(
                payload("ip", "daddr"),
                Operator::EQ,
                s(format!("@{}", rules::NODEPORT_IPS)),
            ),
            Statement::VerdictMap(VerdictMap {
                key: Expression::Named(NamedExpression::Concat(vec![
                    meta(MetaKey::L4proto),
                    payload("th", "dport"),
                ])),
                data: s(format!("@{m}")),
            }),
        ],
        Rule::ReturnIfUnmarked => vec![
            matches(
                Expression::BinaryOperation(Box::new(BinaryOperation::AND(
                    mark(),
                    Expression::Number(rules::MASQ_MARK),
                ))),
                Operator::EQ,
                Expression::Number(0),
            ),
            Statement::Return(None),
        ],
        Rule::ClearMark => vec![Statement::Mangle(Mangle {
            key: mark(),
            value: Expression::BinaryOperation(Box::new(BinaryOperation::XOR(
                mark(),
                Expression::Number(rules::MASQ_MARK),
            ))),
        })],
        Rule::SetMark => vec![Statement::Mangle(Mangle {
            key: mark(),
            value: Expression::BinaryOperation(Box::new(BinaryOperation::OR(vec![
                mark(),
                Expression::Number(rules::MASQ_MARK),
            ]))),
        })],
        Rule::Masquerade => vec![Statement::Masquerade(Some(NAT {
            addr: None,
            family: None,
            port: None,
            flags: Some(HashSet::from([NATFlag::FullyRandom])),
        }))],
        Rule::RejectTcpReset => vec![
            matches(meta(MetaKey::L4proto), Operator::EQ, s("tcp")),
            Statement::Reject(Some(Reject::new(Some(RejectType::TCPReset), None))),
        ],
        Rule::Reject => vec![Statement::Reject(None)],
        Rule::MarkOffCluster(cidr, m) => vec![
            matches(payload("ip", "saddr"), Operator::NEQ, prefix(*cidr)),
            Statement::VerdictMap(VerdictMap {
                key: daddr_proto_port(),
                data: s(format!("@{m}")),
            }),
        ],
        Rule::HairpinMasquerade => vec![
            matches(
                Expression::Named(NamedExpression::CT(CT {
                    key: Cow::Borrowed("status"),
                    family: None,
                    dir: None,
                })),
                Operator::IN,
                s("dnat"),
            ),
            matches(
                Expression::Named(NamedExpression::Concat(vec![
                    payload("ip", "saddr"),
                    payload("ip", "daddr"),
                ])),
                Operator::EQ,
                s(format!("@{}", rules::HAIRPIN)),
            ),
            Statement::Masquerade(Some(NAT {
                addr: None,
                family: None,
                port: None,
                flags: Some(HashSet::from([NATFlag::FullyRandom])),
            })),
        ],
        Rule::MasqueradeIfFromNode => vec![fib_saddr_local(), mark_for_masq],
        Rule::GotoIfFromNode(c) => vec![fib_saddr_local(), Statement::Goto(target(c))],
        Rule::GotoIfFrom(cidr, c) => vec![
            matches(payload("ip", "saddr"), Operator::EQ, prefix(*cidr)),
            Statement::Goto(target(c)),
        ],
        Rule::GotoIfInSet(set, c) => vec![
            matches(payload("ip", "saddr"), Operator::EQ, s(format!("@{set}"))),
            Statement::Goto(target(c)),
        ],
        Rule::AddSourceToSet(set) => vec![Statement::Set(nftables::stmt::Set {
            op: nftables::stmt::SetOp::Update,
            elem: payload("ip", "saddr"),
            set: Cow::Owned(format!("@{set}")),
        })],
        Rule::PickGoto(k, c) => {
            let mut v = pick(*k);
            v.push(Statement::Goto(target(c)));
            v
        }
        Rule::PickDnat(k, p, ip, port) => {
            let mut v = pick(*k);
            v.push(matches(meta(MetaKey::L4proto), Operator::EQ, s(p.nft())));
            v.push(Statement::DNAT(Some(NAT {
                addr: Some(s(ip.to_string())),
                family: Some(NATFamily::IP),
                port: Some(Expression::Number(*port as u32)),
                flags: None,
            })));
            v
        }
        Rule::DnatViaMap(k, p, m) => vec![
            matches(meta(MetaKey::L4proto), Operator::EQ, s(p.nft())),
            Statement::DNAT(Some(NAT {
                addr: Some(Expression::Named(NamedExpression::Map(Box::new(
                    nftables::expr::Map {
                        key: Expression::Named(NamedExpression::Numgen(Numgen {
                            mode: NgMode::Random,
                            ng_mod: *k,
                            offset: Some(0),
                        })),
                        data: s(format!("@{m}")),
                    },
                )))),
                family: Some(NATFamily::IP),
                port: None,
                flags: None,
            })),
        ],
        Rule::AcceptEstablished => vec![
            matches(
                Expression::Named(NamedExpression::CT(CT {
                    key: Cow::Borrowed("state"),
                    family: None,
                    dir: None,
                })),
                Operator::IN,
                Expression::List(vec![s("established"), s("related")]),
            ),
            Statement::Accept(None),
        ],
        Rule::SaddrVmap(m) => vec![Statement::VerdictMap(VerdictMap {
            key: payload("ip", "saddr"),
            data: s(format!("@{m}")),
        })],
        Rule::DaddrVmap(m) => vec![Statement::VerdictMap(VerdictMap {
            key: payload("ip", "daddr"),
            data: s(format!("@{m}")),
        })],
        Rule::EgressCheckTo(ips) => vec![
            matches(payload("ip", "daddr"), Operator::EQ, ip_set(ips)),
            Statement::VerdictMap(VerdictMap {
                key: payload("ip", "saddr"),
                data: s(format!("@{}", super::policy::model::POLICY_EGRESS)),
            }),
        ],
        Rule::Allow(a) => allow_statements(a),
    }
}

fn ip_set(ips: &[Ipv4Addr]) -> Expression<'static> {
    Expression::Named(NamedExpression::Set(
        ips.iter()
            .map(|ip| SetItem::Element(s(ip.to_string())))
            .collect(),
    ))
}

/// A NetworkPolicy allow rule's statements.
fn allow_statements(a: &super::policy::model::Allow) -> Vec<Statement<'static>> {
    use super::policy::model::Addr;
    let field = payload("ip", a.field.nft());
    let mut v = vec![];
    match &a.addr {
        Addr::Any => {}
        Addr::Set(ips) => v.push(matches(field, Operator::EQ, ip_set(ips))),
        Addr::Block(c, except) => {
            v.push(matches(field.clone(), Operator::EQ, prefix(*c)));
            if !except.is_empty() {
                v.push(matches(
                    field,
                    Operator::NEQ,
                    Expression::Named(NamedExpression::Set(
                        except
                            .iter()
                            .map(|e| SetItem::Element(prefix(*e)))
                            .collect(),
                    )),
                ));
            }
        }
    }
    if let Some(p) = a.protocol {
        v.push(matches(meta(MetaKey::L4proto), Operator::EQ, s(p.nft())));
        match a.ports {
            Some((lo, hi)) if lo == hi => v.push(matches(
                payload("th", "dport"),
                Operator::EQ,
                Expression::Number(u32::from(lo)),
            )),
            Some((lo, hi)) => v.push(matches(
                payload("th", "dport"),
                Operator::EQ,
                Expression::Range(Box::new(nftables::expr::Range {
                    range: [
                        Expression::Number(u32::from(lo)),
                        Expression::Number(u32::from(hi)),
                    ],
                })),
            )),
            None => {}
        }
    }
    v.push(Statement::Return(None));
    v
}

/// A system tool by name: from PATH, else /usr/sbin or /sbin (where Debian
/// puts nft and conntrack, and which a non-login PATH may lack).
pub fn tool(name: &str) -> std::path::PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/sbin".into(), "/sbin".into()])
        .map(|d: std::path::PathBuf| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| name.into())
}

/// Runs `nft -j -f -` on a JSON payload: one transaction. (The crate's own
/// runner leaves nft's stderr uncaptured, and its message is what says why
/// a transaction was refused.)
fn run_nft(payload: &str) -> Result<(), Error> {
    use std::io::Write;
    let mut child = std::process::Command::new(tool("nft"))
        .args(["-j", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| Error::NftUnavailable(format!("{e} (apt-get install nftables)")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(payload.as_bytes())
            .map_err(|e| Error::NftUnavailable(e.to_string()))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| Error::NftUnavailable(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        let msg = String::from_utf8_lossy(&out.stderr);
        // nft repeats the whole offending JSON; its first lines say why.
        let msg: String = msg.lines().take(4).collect::<Vec<_>>().join(" | ");
        Err(Error::TransactionFailed(msg.chars().take(2000).collect()))
    }
}

/// Deletes skiff's table and its service shards (what `skiff down`
/// does); absent is fine.
pub fn delete_table(table: &str) -> Result<(), Error> {
    let mut objs = vec![];
    for name in all_tables(table) {
        objs.push(json!({"add": {"table": {"family": "ip", "name": name}}}));
        objs.push(json!({"delete": {"table": {"family": "ip", "name": name}}}));
    }
    run_nft(&json!({ "nftables": objs }).to_string())
}

/// Conntrack entries to delete after an endpoint change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ConntrackFlush {
    /// Entries of a UDP service port translated to an endpoint now gone.
    Endpoint {
        vip: Ipv4Addr,
        port: u16,
        node_port: Option<u16>,
        endpoint: Ipv4Addr,
    },
    /// Every entry of a UDP service port that had no endpoints before.
    Service {
        vip: Ipv4Addr,
        port: u16,
        node_port: Option<u16>,
    },
}

impl ConntrackFlush {
    /// `conntrack -D` argument lists for this flush.
    pub fn args(&self) -> Vec<Vec<String>> {
        let mut out = vec![];
        let (vip, port, node_port, endpoint) = match self {
            ConntrackFlush::Endpoint {
                vip,
                port,
                node_port,
                endpoint,
            } => (*vip, *port, *node_port, Some(*endpoint)),
            ConntrackFlush::Service {
                vip,
                port,
                node_port,
            } => (*vip, *port, *node_port, None),
        };
        let mut a: Vec<String> = ["-D", "-p", "udp", "--orig-dst"]
            .iter()
            .map(|s| s.to_string())
            .collect();
        a.push(vip.to_string());
        a.extend(["--orig-port-dst".to_string(), port.to_string()]);
        if let Some(ep) = endpoint {
            a.extend(["--reply-src".to_string(), ep.to_string()]);
        }
        out.push(a);
        if let Some(np) = node_port {
            let mut a: Vec<String> = ["-D", "-p", "udp", "--orig-port-dst"]
                .iter()
                .map(|s| s.to_string())
                .collect();
            a.push(np.to_string());
            if let Some(ep) = endpoint {
                a.extend(["--reply-src".to_string(), ep.to_string()]);
            }
            out.push(a);
        }
        out
    }
}

/// Runs the flushes (the `conntrack` tool; absent → a warning once).
pub async fn flush_conntrack(flushes: Vec<ConntrackFlush>) {
    let _ = tokio::task::spawn_blocking(move || {
        for f in flushes {
            for args in f.args() {
                match std::process::Command::new(tool("conntrack"))
                    .args(&args)
                    .stdout(std::process::Stdio::null())
                    .stderr(std::process::Stdio::null())
                    .status()
                {
                    // Exit 1 means "no entry matched".
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot run conntrack to flush stale UDP entries (apt-get install conntrack)");
                        return;
                    }
                }
            }
        }
    })
    .await;
}
