//! skiff's own nftables writer: the proxy's objects encoded as nf_tables
//! netlink messages and sent as one batch (NFNL_MSG_BATCH_BEGIN … END, one
//! kernel transaction: all of it or none) over a NETLINK_NETFILTER socket,
//! without starting `nft`. `nft` lists the tables it changes before it
//! applies anything (its cache), which made every change cost a dump of a
//! shard; skiff knows what it wrote, so a change is only its own messages.
//!
//! The messages are the ones `nft` 1.0 sends for the same script (checked
//! with `nft --debug=netlink` and by comparing `nft list` of both in
//! `tests/proxy_netlink.rs`), including the set userdata `nft` reads back
//! to print key types. Rules that can match nothing ([`matches_nothing`]:
//! an empty address list) are left out.
//!
//! Encoding is plain byte building; the socket is `netlink-sys`'s. Numbers
//! are nf_tables' ABI (`linux/netfilter/nf_tables.h`): attributes are
//! big-endian, register contents (marks, ct bits, numgen) host-endian.

use std::collections::HashMap;
use std::net::Ipv4Addr;

use super::model::{Endpoint, Protocol};
use super::policy::model::{Addr, Allow, Field, POLICY_EGRESS};
use super::rules::{self, Home, MapKey, Op, Rule, Verdict};

const NLM_F_REQUEST: u16 = 0x1;
const NLM_F_CREATE: u16 = 0x400;
const NLM_F_APPEND: u16 = 0x800;
const NLA_F_NESTED: u16 = 0x8000;
const NLMSG_ERROR: u16 = 0x2;

const NFNL_SUBSYS_NFTABLES: u16 = 10;
const NFNL_MSG_BATCH_BEGIN: u16 = 0x10;
const NFNL_MSG_BATCH_END: u16 = 0x11;
const AF_UNSPEC: u8 = 0;
const NFPROTO_IPV4: u8 = 2;

const NEWTABLE: u16 = 0;
const DELTABLE: u16 = 2;
const NEWCHAIN: u16 = 3;
const DELCHAIN: u16 = 5;
const NEWRULE: u16 = 6;
const DELRULE: u16 = 8;
const NEWSET: u16 = 9;
const DELSET: u16 = 11;
const NEWSETELEM: u16 = 12;
const DELSETELEM: u16 = 14;

// Registers.
const REG_VERDICT: u32 = 0;
const REG_1: u32 = 1;
const REG_2: u32 = 2;
/// The 32-bit registers after the first: `reg 9`, `reg 10` in nft's debug
/// output (the 2nd and 3rd words of a concatenation starting in reg 1).
const REG32_01: u32 = 9;
const REG32_02: u32 = 10;

// Verdict codes.
const NF_DROP: i32 = 0;
const NF_ACCEPT: i32 = 1;
const NFT_JUMP: i32 = -3;
const NFT_GOTO: i32 = -4;
const NFT_RETURN: i32 = -5;

// Set flags and types.
const SET_ANONYMOUS: u32 = 0x1;
const SET_CONSTANT: u32 = 0x2;
const SET_INTERVAL: u32 = 0x4;
const SET_MAP: u32 = 0x8;
const SET_TIMEOUT: u32 = 0x10;
const SET_EVAL: u32 = 0x20;
const DATA_VERDICT: u32 = 0xffff_ff00;
const TYPE_INTEGER: u32 = 4;
const TYPE_IPV4: u32 = 7;
const TYPE_PROTO: u32 = 12;
const TYPE_SERVICE: u32 = 13;
const ELEM_INTERVAL_END: u32 = 0x1;

// Payload bases, meta and ct keys.
const BASE_NETWORK: u32 = 1;
const BASE_TRANSPORT: u32 = 2;
const META_MARK: u32 = 3;
const META_L4PROTO: u32 = 16;
const CT_STATE: u32 = 0;
const CT_STATUS: u32 = 2;
const CMP_EQ: u32 = 0;
const CMP_NEQ: u32 = 1;
const CT_ESTABLISHED: u32 = 1 << 1;
const CT_RELATED: u32 = 1 << 2;
const CT_NEW: u32 = 1 << 3;
const IPS_DST_NAT: u32 = 1 << 5;
const RTN_LOCAL: u32 = 2;
const NAT_RANGE_PROTO_SPECIFIED: u32 = 0x2;
const NAT_RANGE_PROTO_RANDOM_FULLY: u32 = 0x10;

/// `nft`'s set userdata (key/data byte order, concatenation info) for the
/// set shapes skiff declares, as `nft` 1.0.6 sends them: `nft list` reads
/// it back to print a set's type.
const UD_CONCAT_VMAP: &[u8] = &[
    0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x08, 0x00, 0x04,
    0x0d, 0x00, 0x00, 0x00, 0x01, 0x00, 0x06, 0x04, 0x00, 0x00, 0x00, 0x00,
];
const UD_ADDR_VMAP: &[u8] = &[
    0x00, 0x04, 0x02, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x06, 0x04, 0x00, 0x00,
    0x00, 0x00,
];
const UD_ADDR: &[u8] = &[0x00, 0x04, 0x02, 0x00, 0x00, 0x00];
const UD_CONCAT: &[u8] = &[
    0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x08, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x00,
];
/// `typeof numgen random mod 10 : ip daddr . tcp dport` (an endpoint
/// map): the modulus is the u32 at [`UD_NUMGEN_MOD`], the transport
/// protocol nft's id of its header at [`UD_NUMGEN_PROTO`].
const UD_NUMGEN_MAP: [u8; 100] = [
    0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03, 0x1a, 0x00, 0x04,
    0x17, 0x00, 0x00, 0x00, 0x01, 0x12, 0x00, 0x04, 0x01, 0x00, 0x00, 0x00, 0x01, 0x04, 0x0a, 0x00,
    0x00, 0x00, 0x02, 0x04, 0x00, 0x00, 0x00, 0x00, 0x04, 0x34, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00,
    0x01, 0x2c, 0x00, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00, 0x01, 0x0c, 0x00, 0x04, 0x0c, 0x00,
    0x00, 0x00, 0x01, 0x04, 0x0c, 0x00, 0x00, 0x00, 0x01, 0x14, 0x00, 0x04, 0x07, 0x00, 0x00, 0x00,
    0x01, 0x0c, 0x00, 0x04, 0x08, 0x00, 0x00, 0x00, 0x01, 0x04, 0x02, 0x00, 0x00, 0x00, 0x06, 0x04,
    0x00, 0x00, 0x00, 0x00,
];
const UD_NUMGEN_MOD: usize = 30;
const UD_NUMGEN_PROTO: usize = 84;

/// [`UD_NUMGEN_MAP`] for modulus `k` and protocol `p`.
fn numgen_map_userdata(k: u32, p: Protocol) -> Vec<u8> {
    let mut ud = UD_NUMGEN_MAP.to_vec();
    ud[UD_NUMGEN_MOD..UD_NUMGEN_MOD + 4].copy_from_slice(&k.to_ne_bytes());
    // nft's protocol header ids (proto_tcp, proto_udp, proto_sctp).
    ud[UD_NUMGEN_PROTO] = match p {
        Protocol::Tcp => 8,
        Protocol::Udp => 6,
        Protocol::Sctp => 10,
    };
    ud
}

/// Largest set-element message body: a netlink attribute's length is 16
/// bits, so big element lists go in several messages of the same batch.
const ELEMENTS_PER_MESSAGE: usize = 400;

/// Whether `rule` can match no packet at all: an address list that is
/// empty, or an ipBlock whose exceptions include 0.0.0.0/0. Such rules are
/// not written (nft writes them as empty anonymous sets).
pub fn matches_nothing(rule: &Rule) -> bool {
    match rule {
        Rule::Allow(a) => match &a.addr {
            Addr::Block(_, except) => except.iter().any(|e| e.1 == 0),
            Addr::Set(ips) => ips.is_empty(),
            Addr::Any => false,
        },
        Rule::EgressCheckTo(ips) => ips.is_empty(),
        _ => false,
    }
}

/// What a set element carries besides its key.
enum ElemData<'a> {
    None,
    Verdict(&'a Verdict),
    Value(Vec<u8>),
}

/// A batch of nf_tables messages being built.
pub struct Batch {
    buf: Vec<u8>,
    seq: u32,
    msg_start: usize,
    nests: Vec<usize>,
    next_set_id: u32,
    /// Sets declared in this batch: (table, set) → NFTA_SET_ID.
    set_ids: HashMap<(String, String), u32>,
    anon: u32,
    /// What each message is (by sequence number), for error messages.
    what: Vec<String>,
    describe: bool,
}

impl Default for Batch {
    fn default() -> Self {
        Self::new()
    }
}

impl Batch {
    pub fn new() -> Batch {
        let mut b = Batch {
            buf: Vec::with_capacity(4096),
            seq: 0,
            msg_start: 0,
            nests: vec![],
            next_set_id: 1,
            set_ids: HashMap::new(),
            anon: 0,
            what: vec![],
            describe: true,
        };
        b.begin(
            NFNL_MSG_BATCH_BEGIN,
            0,
            AF_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
            "batch begin",
        );
        b.end();
        b
    }

    /// Stops recording a description per message (large batches).
    pub fn quiet(&mut self) {
        self.describe = false;
    }

    /// Number of messages so far (batch begin included).
    pub fn messages(&self) -> u32 {
        self.seq
    }

    pub fn len(&self) -> usize {
        self.buf.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seq <= 1
    }

    /// Ends the batch: the bytes to send and each message's description.
    pub fn finish(mut self) -> (Vec<u8>, Vec<String>) {
        self.begin(
            NFNL_MSG_BATCH_END,
            0,
            AF_UNSPEC,
            NFNL_SUBSYS_NFTABLES,
            "batch end",
        );
        self.end();
        (self.buf, self.what)
    }

    fn begin(&mut self, ty: u16, flags: u16, family: u8, res_id: u16, what: &str) {
        debug_assert!(self.nests.is_empty());
        self.msg_start = self.buf.len();
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf
            .extend_from_slice(&(flags | NLM_F_REQUEST).to_ne_bytes());
        self.buf.extend_from_slice(&self.seq.to_ne_bytes());
        self.buf.extend_from_slice(&0u32.to_ne_bytes());
        self.buf.push(family);
        self.buf.push(0);
        self.buf.extend_from_slice(&res_id.to_be_bytes());
        if self.describe {
            self.what.push(what.to_string());
        }
        self.seq += 1;
    }

    fn msg(&mut self, ty: u16, flags: u16, what: impl FnOnce() -> String) {
        let w = if self.describe { what() } else { String::new() };
        self.begin((NFNL_SUBSYS_NFTABLES << 8) | ty, flags, NFPROTO_IPV4, 0, &w);
    }

    fn end(&mut self) {
        let len = (self.buf.len() - self.msg_start) as u32;
        self.buf[self.msg_start..self.msg_start + 4].copy_from_slice(&len.to_ne_bytes());
    }

    fn attr(&mut self, ty: u16, data: &[u8]) {
        let len = (4 + data.len()) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(data);
        self.pad();
    }

    fn pad(&mut self) {
        while !self.buf.len().is_multiple_of(4) {
            self.buf.push(0);
        }
    }

    fn str(&mut self, ty: u16, s: &str) {
        let len = (4 + s.len() + 1) as u16;
        self.buf.extend_from_slice(&len.to_ne_bytes());
        self.buf.extend_from_slice(&ty.to_ne_bytes());
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self.pad();
    }

    fn u32(&mut self, ty: u16, v: u32) {
        self.attr(ty, &v.to_be_bytes());
    }

    fn nest(&mut self, ty: u16) {
        self.nests.push(self.buf.len());
        self.buf.extend_from_slice(&[0, 0]);
        self.buf
            .extend_from_slice(&(ty | NLA_F_NESTED).to_ne_bytes());
    }

    fn unnest(&mut self) {
        let start = self.nests.pop().expect("balanced nests");
        let len = self.buf.len() - start;
        assert!(len <= u16::MAX as usize, "netlink attribute too long");
        self.buf[start..start + 2].copy_from_slice(&(len as u16).to_ne_bytes());
    }

    /// `NFTA_DATA_VALUE` inside a nest of type `ty`.
    fn value(&mut self, ty: u16, bytes: &[u8]) {
        self.nest(ty);
        self.attr(1, bytes);
        self.unnest();
    }

    fn verdict_data(&mut self, ty: u16, code: i32, chain: Option<&str>) {
        self.nest(ty);
        self.nest(2); // NFTA_DATA_VERDICT
        self.u32(1, code as u32);
        if let Some(c) = chain {
            self.str(2, c);
        }
        self.unnest();
        self.unnest();
    }

    // ---- objects ----

    pub fn add_table(&mut self, table: &str) {
        self.msg(NEWTABLE, 0, || format!("add table ip {table}"));
        self.str(1, table);
        self.u32(2, 0);
        self.end();
    }

    pub fn delete_table(&mut self, table: &str) {
        self.msg(DELTABLE, 0, || format!("delete table ip {table}"));
        self.str(1, table);
        self.end();
    }

    pub fn add_chain(&mut self, table: &str, chain: &str, hook: Option<&rules::Hook>) {
        self.msg(NEWCHAIN, NLM_F_CREATE, || {
            format!("add chain ip {table} {chain}")
        });
        self.str(1, table);
        self.str(3, chain);
        if let Some(h) = hook {
            self.str(7, if h.nat { "nat" } else { "filter" });
            self.nest(4);
            let num = match h.hook {
                "prerouting" => 0,
                "input" => 1,
                "forward" => 2,
                "output" => 3,
                _ => 4,
            };
            self.u32(1, num);
            self.u32(2, h.priority as u32);
            self.unnest();
        }
        self.end();
    }

    pub fn delete_chain(&mut self, table: &str, chain: &str) {
        self.msg(DELCHAIN, 0, || format!("delete chain ip {table} {chain}"));
        self.str(1, table);
        self.str(3, chain);
        self.end();
    }

    pub fn flush_chain(&mut self, table: &str, chain: &str) {
        self.msg(DELRULE, 0, || format!("flush chain ip {table} {chain}"));
        self.str(1, table);
        self.str(2, chain);
        self.end();
    }

    fn set_id(&mut self, table: &str, set: &str) -> u32 {
        let id = self.next_set_id;
        self.next_set_id += 1;
        self.set_ids
            .insert((table.to_string(), set.to_string()), id);
        id
    }

    #[allow(clippy::too_many_arguments)]
    fn new_set(
        &mut self,
        table: &str,
        set: &str,
        flags: u32,
        key_type: u32,
        key_len: u32,
        data: Option<(u32, u32)>,
        timeout_ms: Option<u64>,
        userdata: Option<&[u8]>,
        size: Option<u32>,
    ) -> u32 {
        let id = self.set_id(table, set);
        self.msg(NEWSET, NLM_F_CREATE, || format!("add set ip {table} {set}"));
        self.str(1, table);
        self.str(2, set);
        self.u32(3, flags);
        self.u32(4, key_type);
        self.u32(5, key_len);
        if let Some((ty, len)) = data {
            self.u32(6, ty);
            self.u32(7, len);
        }
        if let Some(n) = size {
            self.nest(9); // NFTA_SET_DESC
            self.u32(1, n); // NFTA_SET_DESC_SIZE
            self.unnest();
        }
        self.u32(10, id);
        if let Some(t) = timeout_ms {
            self.attr(11, &t.to_be_bytes());
        }
        if let Some(ud) = userdata {
            self.attr(13, ud);
        }
        self.end();
        id
    }

    /// A verdict map keyed by `ip . proto . port` (`by_ip`) or `proto . port`.
    pub fn add_service_map(&mut self, table: &str, map: &str, by_ip: bool) {
        let (ty, len) = if by_ip {
            ((TYPE_IPV4 << 12) | (TYPE_PROTO << 6) | TYPE_SERVICE, 12)
        } else {
            ((TYPE_PROTO << 6) | TYPE_SERVICE, 8)
        };
        self.new_set(
            table,
            map,
            SET_MAP,
            ty,
            len,
            Some((DATA_VERDICT, 0)),
            None,
            Some(UD_CONCAT_VMAP),
            None,
        );
    }

    /// A verdict map keyed by an address.
    pub fn add_addr_map(&mut self, table: &str, map: &str) {
        self.new_set(
            table,
            map,
            SET_MAP,
            TYPE_IPV4,
            4,
            Some((DATA_VERDICT, 0)),
            None,
            Some(UD_ADDR_VMAP),
            None,
        );
    }

    /// A set of at most `size` `ip . ip` pairs.
    pub fn add_pair_set(&mut self, table: &str, set: &str, size: u32) {
        self.new_set(
            table,
            set,
            0,
            (TYPE_IPV4 << 6) | TYPE_IPV4,
            8,
            None,
            None,
            Some(UD_CONCAT),
            Some(size),
        );
    }

    /// A set of addresses, with a timeout for its elements if given (in
    /// seconds).
    pub fn add_addr_set(&mut self, table: &str, set: &str, timeout: Option<u32>) {
        // Timeout sets are the affinity sets, updated from the packet path
        // (`dynamic`, as nft declares them).
        let flags = if timeout.is_some() {
            SET_TIMEOUT | SET_EVAL
        } else {
            0
        };
        self.new_set(
            table,
            set,
            flags,
            TYPE_IPV4,
            4,
            None,
            timeout.map(|t| u64::from(t) * 1000),
            Some(UD_ADDR),
            None,
        );
    }

    /// An endpoint map: a random index (`numgen random mod k`) to
    /// `address . port`.
    pub fn add_dnat_map(&mut self, table: &str, map: &str, protocol: Protocol, k: u32) {
        self.new_set(
            table,
            map,
            SET_MAP,
            TYPE_INTEGER,
            4,
            Some(((TYPE_IPV4 << 6) | TYPE_SERVICE, 8)),
            None,
            Some(&numgen_map_userdata(k, protocol)),
            None,
        );
    }

    /// Element `i` of endpoint map `map`: the i-th endpoint.
    pub fn fill_dnat_map(&mut self, table: &str, map: &str, endpoints: &[Endpoint]) {
        let e: Vec<(Vec<u8>, ElemData)> = endpoints
            .iter()
            .enumerate()
            .map(|(i, ep)| {
                let mut v = ep.ip.octets().to_vec();
                v.extend_from_slice(&ep.port.to_be_bytes());
                v.extend_from_slice(&[0, 0]);
                ((i as u32).to_ne_bytes().to_vec(), ElemData::Value(v))
            })
            .collect();
        self.elements(table, map, false, &e);
    }

    /// Deletes every element of `set`.
    pub fn flush_set(&mut self, table: &str, set: &str) {
        self.msg(DELSETELEM, 0, || format!("flush set ip {table} {set}"));
        self.str(1, table);
        self.str(2, set);
        self.end();
    }

    pub fn delete_set(&mut self, table: &str, set: &str) {
        self.msg(DELSET, 0, || format!("delete set ip {table} {set}"));
        self.str(1, table);
        self.str(2, set);
        self.end();
    }

    /// Adds (`Some` data, or `None` for plain sets) or deletes elements,
    /// in messages of at most [`ELEMENTS_PER_MESSAGE`].
    fn elements(&mut self, table: &str, set: &str, delete: bool, elems: &[(Vec<u8>, ElemData)]) {
        let id = self
            .set_ids
            .get(&(table.to_string(), set.to_string()))
            .copied();
        for chunk in elems.chunks(ELEMENTS_PER_MESSAGE) {
            let (ty, flags, verb) = if delete {
                (DELSETELEM, 0, "delete")
            } else {
                (NEWSETELEM, NLM_F_CREATE, "add")
            };
            self.msg(ty, flags, || {
                format!("{verb} element ip {table} {set} ({} elements)", chunk.len())
            });
            self.str(1, table);
            self.str(2, set);
            if let Some(id) = id {
                self.u32(4, id);
            }
            self.nest(3);
            for (key, data) in chunk {
                self.nest(1);
                self.value(1, key);
                match data {
                    ElemData::None => {}
                    ElemData::Verdict(v) => {
                        let (code, chain) = verdict(v);
                        self.verdict_data(2, code, chain);
                    }
                    ElemData::Value(v) => self.value(2, v),
                }
                self.unnest();
            }
            self.unnest();
            self.end();
        }
    }

    pub fn add_map_elements(&mut self, table: &str, map: &str, elems: &[(&MapKey, &Verdict)]) {
        let e: Vec<(Vec<u8>, ElemData)> = elems
            .iter()
            .map(|(k, v)| (key_bytes(k), ElemData::Verdict(v)))
            .collect();
        self.elements(table, map, false, &e);
    }

    pub fn delete_map_elements(&mut self, table: &str, map: &str, keys: &[&MapKey]) {
        let e: Vec<(Vec<u8>, ElemData)> = keys
            .iter()
            .map(|k| (key_bytes(k), ElemData::None))
            .collect();
        self.elements(table, map, true, &e);
    }

    pub fn add_addrs(&mut self, table: &str, set: &str, ips: &[Ipv4Addr]) {
        let e: Vec<(Vec<u8>, ElemData)> = ips
            .iter()
            .map(|ip| (ip.octets().to_vec(), ElemData::None))
            .collect();
        self.elements(table, set, false, &e);
    }

    pub fn hairpin(&mut self, table: &str, ips: &[Ipv4Addr], delete: bool) {
        let e: Vec<(Vec<u8>, ElemData)> = ips
            .iter()
            .map(|ip| {
                let mut k = ip.octets().to_vec();
                k.extend_from_slice(&ip.octets());
                (k, ElemData::None)
            })
            .collect();
        self.elements(table, rules::HAIRPIN, delete, &e);
    }

    /// An anonymous constant set of addresses or (`interval`) of CIDRs,
    /// for a rule of this batch; returns its name and id.
    fn anonymous_set(
        &mut self,
        table: &str,
        elems: &[(Ipv4Addr, u8)],
        interval: bool,
    ) -> (String, u32) {
        let name = format!("__set{}", self.anon);
        self.anon += 1;
        let mut flags = SET_ANONYMOUS | SET_CONSTANT;
        if interval {
            flags |= SET_INTERVAL;
        }
        let id = self.new_set(table, &name, flags, TYPE_IPV4, 4, None, None, None, None);
        // Interval sets hold range boundaries: each range's start, and the
        // address after its end flagged as an end (nothing after the last
        // address); like nft, a leading end at 0.0.0.0 when the first range
        // does not start there.
        let mut keys: Vec<(Vec<u8>, u32)> = vec![];
        if interval {
            let mut ranges: Vec<(u32, u64)> = elems
                .iter()
                .map(|(ip, len)| {
                    let mask = if *len == 0 {
                        0
                    } else {
                        u32::MAX << (32 - u32::from(*len))
                    };
                    let start = u32::from(*ip) & mask;
                    (start, u64::from(start) + (1u64 << (32 - u32::from(*len))))
                })
                .collect();
            ranges.sort();
            let mut merged: Vec<(u32, u64)> = vec![];
            for r in ranges {
                match merged.last_mut() {
                    Some(last) if u64::from(r.0) <= last.1 => last.1 = last.1.max(r.1),
                    _ => merged.push(r),
                }
            }
            if merged.first().is_some_and(|r| r.0 != 0) {
                keys.push((vec![0, 0, 0, 0], ELEM_INTERVAL_END));
            }
            for (start, end) in merged {
                keys.push((start.to_be_bytes().to_vec(), 0));
                if end <= u64::from(u32::MAX) {
                    keys.push(((end as u32).to_be_bytes().to_vec(), ELEM_INTERVAL_END));
                }
            }
        } else {
            let mut ips: Vec<Ipv4Addr> = elems.iter().map(|e| e.0).collect();
            ips.sort();
            ips.dedup();
            keys = ips.iter().map(|ip| (ip.octets().to_vec(), 0)).collect();
        }
        for chunk in keys.chunks(ELEMENTS_PER_MESSAGE) {
            self.msg(NEWSETELEM, NLM_F_CREATE, || {
                format!("add element ip {table} {name}")
            });
            self.str(1, table);
            self.str(2, &name);
            self.u32(4, id);
            self.nest(3);
            for (key, flags) in chunk {
                self.nest(1);
                self.value(1, key);
                if *flags != 0 {
                    self.u32(3, *flags);
                }
                self.unnest();
            }
            self.unnest();
            self.end();
        }
        (name, id)
    }

    /// Appends `rule` to `chain`.
    pub fn add_rule(&mut self, table: &str, chain: &str, rule: &Rule) {
        if matches_nothing(rule) {
            return;
        }
        // Anonymous sets must exist before the rule that looks them up.
        let anon = self.anonymous_sets_for(table, rule);
        self.msg(NEWRULE, NLM_F_CREATE | NLM_F_APPEND, || {
            format!("add rule ip {table} {chain} {rule}")
        });
        self.str(1, table);
        self.str(2, chain);
        self.nest(4);
        let mut anon = anon.into_iter();
        self.rule_exprs(rule, &mut anon);
        self.unnest();
        self.end();
    }

    /// The anonymous sets `rule` looks up (nft compares with a lone
    /// element directly, and so does this encoder).
    fn anonymous_sets_for(&mut self, table: &str, rule: &Rule) -> Vec<(String, u32)> {
        let one = |ips: &[Ipv4Addr]| {
            let mut v = ips.to_vec();
            v.sort();
            v.dedup();
            v.len() == 1
        };
        match rule {
            Rule::EgressCheckTo(ips)
            | Rule::Allow(Allow {
                addr: Addr::Set(ips),
                ..
            }) if !one(ips) => {
                let e: Vec<(Ipv4Addr, u8)> = ips.iter().map(|ip| (*ip, 32)).collect();
                vec![self.anonymous_set(table, &e, false)]
            }
            Rule::Allow(Allow {
                addr: Addr::Block(_, except),
                ..
            }) if except.len() > 1 => vec![self.anonymous_set(table, except, true)],
            _ => vec![],
        }
    }

    /// `ip FIELD { ips }`: a lookup in the rule's anonymous set, or a
    /// comparison with the only address.
    fn addr_in(
        &mut self,
        table: &str,
        field: Field,
        ips: &[Ipv4Addr],
        anon: &mut impl Iterator<Item = (String, u32)>,
    ) {
        self.ip_field(field, REG_1);
        let mut v = ips.to_vec();
        v.sort();
        v.dedup();
        if v.len() == 1 {
            self.cmp(CMP_EQ, &v[0].octets());
        } else {
            let (name, _) = anon.next().expect("anonymous set declared");
            self.lookup(table, &name, None, false);
        }
    }

    // ---- expressions ----

    fn expr(&mut self, name: &str) {
        self.nest(1); // NFTA_LIST_ELEM
        self.str(1, name);
        self.nest(2); // NFTA_EXPR_DATA
    }

    fn expr_end(&mut self) {
        self.unnest();
        self.unnest();
    }

    fn payload(&mut self, base: u32, offset: u32, len: u32, dreg: u32) {
        self.expr("payload");
        self.u32(1, dreg);
        self.u32(2, base);
        self.u32(3, offset);
        self.u32(4, len);
        self.expr_end();
    }

    fn ip_field(&mut self, field: Field, dreg: u32) {
        let off = match field {
            Field::Saddr => 12,
            Field::Daddr => 16,
        };
        self.payload(BASE_NETWORK, off, 4, dreg);
    }

    fn dport(&mut self, dreg: u32) {
        self.payload(BASE_TRANSPORT, 2, 2, dreg);
    }

    fn meta(&mut self, key: u32, dreg: u32) {
        self.expr("meta");
        self.u32(2, key);
        self.u32(1, dreg);
        self.expr_end();
    }

    fn meta_set(&mut self, key: u32, sreg: u32) {
        self.expr("meta");
        self.u32(2, key);
        self.u32(3, sreg);
        self.expr_end();
    }

    fn ct(&mut self, key: u32, dreg: u32) {
        self.expr("ct");
        self.u32(2, key);
        self.u32(1, dreg);
        self.expr_end();
    }

    fn cmp(&mut self, op: u32, data: &[u8]) {
        self.expr("cmp");
        self.u32(1, REG_1);
        self.u32(2, op);
        self.value(3, data);
        self.expr_end();
    }

    fn bitwise(&mut self, mask: &[u8], xor: &[u8]) {
        self.expr("bitwise");
        self.u32(1, REG_1);
        self.u32(2, REG_1);
        self.u32(3, mask.len() as u32);
        self.value(4, mask);
        self.value(5, xor);
        self.expr_end();
    }

    /// `reg1 & bits != 0` on a 32-bit host-order register.
    fn any_bits(&mut self, bits: u32) {
        self.bitwise(&bits.to_ne_bytes(), &0u32.to_ne_bytes());
        self.cmp(CMP_NEQ, &0u32.to_ne_bytes());
    }

    fn lookup(&mut self, table: &str, set: &str, dreg: Option<u32>, inverted: bool) {
        let id = self
            .set_ids
            .get(&(table.to_string(), set.to_string()))
            .copied();
        self.expr("lookup");
        self.str(1, set);
        self.u32(2, REG_1);
        if let Some(d) = dreg {
            self.u32(3, d);
        }
        if let Some(id) = id {
            self.u32(4, id);
        }
        if inverted {
            self.u32(5, 1);
        }
        self.expr_end();
    }

    fn verdict(&mut self, code: i32, chain: Option<&str>) {
        self.expr("immediate");
        self.u32(1, REG_VERDICT);
        self.verdict_data(2, code, chain);
        self.expr_end();
    }

    fn immediate(&mut self, dreg: u32, data: &[u8]) {
        self.expr("immediate");
        self.u32(1, dreg);
        self.value(2, data);
        self.expr_end();
    }

    fn masquerade(&mut self) {
        self.expr("masq");
        self.u32(1, NAT_RANGE_PROTO_RANDOM_FULLY);
        self.expr_end();
    }

    fn fib_saddr_local(&mut self) {
        self.expr("fib");
        self.u32(1, REG_1);
        self.u32(2, 3); // NFT_FIB_RESULT_ADDRTYPE
        self.u32(3, 1); // NFTA_FIB_F_SADDR
        self.expr_end();
        self.cmp(CMP_EQ, &RTN_LOCAL.to_ne_bytes());
    }

    fn pick(&mut self, k: u32) {
        if k > 1 {
            self.expr("numgen");
            self.u32(1, REG_1);
            self.u32(2, k);
            self.u32(3, 1); // NFT_NG_RANDOM
            self.expr_end();
            self.cmp(CMP_EQ, &0u32.to_ne_bytes());
        }
    }

    fn l4proto_is(&mut self, p: Protocol) {
        self.meta(META_L4PROTO, REG_1);
        self.cmp(CMP_EQ, &[proto_num(p)]);
    }

    /// `ip FIELD CIDR` (or `!=`) as nft writes it: a load of the prefix's
    /// bytes when it ends on a byte, else of the address, masked.
    fn prefix(&mut self, field: Field, (ip, len): (Ipv4Addr, u8), op: u32) {
        let off = match field {
            Field::Saddr => 12,
            Field::Daddr => 16,
        };
        let mask = if len == 0 {
            0
        } else {
            u32::MAX << (32 - u32::from(len.min(32)))
        };
        let net = (u32::from(ip) & mask).to_be_bytes();
        if len % 8 == 0 && len > 0 {
            let bytes = usize::from(len / 8);
            self.payload(BASE_NETWORK, off, bytes as u32, REG_1);
            self.cmp(op, &net[..bytes]);
        } else {
            self.payload(BASE_NETWORK, off, 4, REG_1);
            self.bitwise(&mask.to_be_bytes(), &[0; 4]);
            self.cmp(op, &net);
        }
    }

    fn concat_daddr_proto_port(&mut self) {
        self.ip_field(Field::Daddr, REG_1);
        self.meta(META_L4PROTO, REG32_01);
        self.dport(REG32_02);
    }

    fn rule_exprs(&mut self, r: &Rule, anon: &mut impl Iterator<Item = (String, u32)>) {
        // The table of the rule is only needed for set lookups, which name
        // sets of the same table; `lookup` finds ids by (table, set), so
        // keep the table of the current message.
        let table = self.current_table();
        match r {
            Rule::Jump(c) => self.verdict(NFT_JUMP, Some(c)),
            Rule::Goto(c) => self.verdict(NFT_GOTO, Some(c)),
            Rule::Drop => self.verdict(NF_DROP, None),
            Rule::JumpIfNew(c) => {
                self.ct(CT_STATE, REG_1);
                self.any_bits(CT_NEW);
                self.verdict(NFT_JUMP, Some(c));
            }
            Rule::DaddrProtoPortVmap(m) => {
                self.concat_daddr_proto_port();
                self.lookup(&table, m, Some(REG_VERDICT), false);
            }
            Rule::NodePortVmap(m) => {
                self.ip_field(Field::Daddr, REG_1);
                self.lookup(&table, rules::NODEPORT_IPS, None, false);
                self.meta(META_L4PROTO, REG_1);
                self.dport(REG32_01);
                self.lookup(&table, m, Some(REG_VERDICT), false);
            }
            Rule::ReturnIfUnmarked => {
                self.meta(META_MARK, REG_1);
                self.bitwise(&rules::MASQ_MARK.to_ne_bytes(), &0u32.to_ne_bytes());
                self.cmp(CMP_EQ, &0u32.to_ne_bytes());
                self.verdict(NFT_RETURN, None);
            }
            Rule::ClearMark => {
                self.meta(META_MARK, REG_1);
                self.bitwise(&u32::MAX.to_ne_bytes(), &rules::MASQ_MARK.to_ne_bytes());
                self.meta_set(META_MARK, REG_1);
            }
            Rule::SetMark => {
                self.meta(META_MARK, REG_1);
                self.bitwise(
                    &(!rules::MASQ_MARK).to_ne_bytes(),
                    &rules::MASQ_MARK.to_ne_bytes(),
                );
                self.meta_set(META_MARK, REG_1);
            }
            Rule::Masquerade => self.masquerade(),
            Rule::RejectTcpReset => {
                self.l4proto_is(Protocol::Tcp);
                self.expr("reject");
                self.u32(1, 1); // NFT_REJECT_TCP_RST
                self.attr(2, &[0]);
                self.expr_end();
            }
            Rule::Reject => {
                self.expr("reject");
                self.u32(1, 0); // NFT_REJECT_ICMP_UNREACH
                self.attr(2, &[3]); // port unreachable
                self.expr_end();
            }
            Rule::MarkOffCluster(cidr, m) => {
                self.prefix(Field::Saddr, *cidr, CMP_NEQ);
                self.concat_daddr_proto_port();
                self.lookup(&table, m, Some(REG_VERDICT), false);
            }
            Rule::HairpinMasquerade => {
                self.ct(CT_STATUS, REG_1);
                self.any_bits(IPS_DST_NAT);
                self.ip_field(Field::Saddr, REG_1);
                self.ip_field(Field::Daddr, REG32_01);
                self.lookup(&table, rules::HAIRPIN, None, false);
                self.masquerade();
            }
            Rule::MasqueradeIfFromNode => {
                self.fib_saddr_local();
                self.verdict(NFT_JUMP, Some(rules::MARK_FOR_MASQ));
            }
            Rule::GotoIfFromNode(c) => {
                self.fib_saddr_local();
                self.verdict(NFT_GOTO, Some(c));
            }
            Rule::GotoIfFrom(cidr, c) => {
                self.prefix(Field::Saddr, *cidr, CMP_EQ);
                self.verdict(NFT_GOTO, Some(c));
            }
            Rule::GotoIfInSet(set, c) => {
                self.ip_field(Field::Saddr, REG_1);
                self.lookup(&table, set, None, false);
                self.verdict(NFT_GOTO, Some(c));
            }
            Rule::AddSourceToSet(set) => {
                self.ip_field(Field::Saddr, REG_1);
                let id = self.set_ids.get(&(table.clone(), set.clone())).copied();
                self.expr("dynset");
                self.str(1, set);
                if let Some(id) = id {
                    self.u32(2, id);
                }
                self.u32(3, 1); // NFT_DYNSET_OP_UPDATE
                self.u32(4, REG_1);
                self.expr_end();
            }
            Rule::PickGoto(k, c) => {
                self.pick(*k);
                self.verdict(NFT_GOTO, Some(c));
            }
            Rule::PickDnat(k, p, ip, port) => {
                self.pick(*k);
                self.l4proto_is(*p);
                self.immediate(REG_1, &ip.octets());
                self.immediate(REG_2, &port.to_be_bytes());
                self.expr("nat");
                self.u32(1, 1); // NFT_NAT_DNAT
                self.u32(2, u32::from(NFPROTO_IPV4));
                self.u32(3, REG_1);
                self.u32(5, REG_2);
                self.u32(7, NAT_RANGE_PROTO_SPECIFIED);
                self.expr_end();
            }
            Rule::DnatViaMap(k, p, m) => {
                self.l4proto_is(*p);
                self.expr("numgen");
                self.u32(1, REG_1);
                self.u32(2, *k);
                self.u32(3, 1); // NFT_NG_RANDOM
                self.u32(4, 0); // offset
                self.expr_end();
                self.lookup(&table, m, Some(REG_1), false);
                self.expr("nat");
                self.u32(1, 1); // NFT_NAT_DNAT
                self.u32(2, u32::from(NFPROTO_IPV4));
                self.u32(3, REG_1);
                self.u32(5, REG32_01);
                self.expr_end();
            }
            Rule::AcceptEstablished => {
                self.ct(CT_STATE, REG_1);
                self.any_bits(CT_ESTABLISHED | CT_RELATED);
                self.verdict(NF_ACCEPT, None);
            }
            Rule::SaddrVmap(m) => {
                self.ip_field(Field::Saddr, REG_1);
                self.lookup(&table, m, Some(REG_VERDICT), false);
            }
            Rule::DaddrVmap(m) => {
                self.ip_field(Field::Daddr, REG_1);
                self.lookup(&table, m, Some(REG_VERDICT), false);
            }
            Rule::EgressCheckTo(ips) => {
                self.addr_in(&table, Field::Daddr, ips, anon);
                self.ip_field(Field::Saddr, REG_1);
                self.lookup(&table, POLICY_EGRESS, Some(REG_VERDICT), false);
            }
            Rule::Allow(a) => self.allow(&table, a, anon),
        }
    }

    fn allow(&mut self, table: &str, a: &Allow, anon: &mut impl Iterator<Item = (String, u32)>) {
        match &a.addr {
            Addr::Any => {}
            Addr::Set(ips) => self.addr_in(table, a.field, ips, anon),
            Addr::Block(c, except) => {
                self.prefix(a.field, *c, CMP_EQ);
                if except.len() == 1 {
                    self.prefix(a.field, except[0], CMP_NEQ);
                } else if !except.is_empty() {
                    let (name, _) = anon.next().expect("anonymous set declared");
                    self.ip_field(a.field, REG_1);
                    self.lookup(table, &name, None, true);
                }
            }
        }
        if let Some(p) = a.protocol {
            self.l4proto_is(p);
            match a.ports {
                Some((lo, hi)) if lo == hi => {
                    self.dport(REG_1);
                    self.cmp(CMP_EQ, &lo.to_be_bytes());
                }
                Some((lo, hi)) => {
                    self.dport(REG_1);
                    self.expr("range");
                    self.u32(1, REG_1);
                    self.u32(2, 0); // NFT_RANGE_EQ
                    self.value(3, &lo.to_be_bytes());
                    self.value(4, &hi.to_be_bytes());
                    self.expr_end();
                }
                None => {}
            }
        }
        self.verdict(NFT_RETURN, None);
    }

    /// The table named by the message being built (its first attribute).
    fn current_table(&self) -> String {
        // nlmsghdr (16) + nfgenmsg (4) + attr header (4).
        let start = self.msg_start + 24;
        let len = u16::from_ne_bytes([self.buf[self.msg_start + 20], self.buf[self.msg_start + 21]])
            as usize;
        let s = &self.buf[start..start + len - 4];
        String::from_utf8_lossy(s.split(|b| *b == 0).next().unwrap_or(&[])).into_owned()
    }
}

fn proto_num(p: Protocol) -> u8 {
    match p {
        Protocol::Tcp => 6,
        Protocol::Udp => 17,
        Protocol::Sctp => 132,
    }
}

fn verdict(v: &Verdict) -> (i32, Option<&str>) {
    match v {
        Verdict::Goto(c) => (NFT_GOTO, Some(c)),
        Verdict::Jump(c) => (NFT_JUMP, Some(c)),
        Verdict::Drop => (NF_DROP, None),
    }
}

/// A map key as the kernel stores it: each field of a concatenation in
/// its own 32-bit word.
fn key_bytes(k: &MapKey) -> Vec<u8> {
    match k {
        MapKey::Ip(ip, p, port) => {
            let mut v = ip.octets().to_vec();
            v.extend_from_slice(&[proto_num(*p), 0, 0, 0]);
            v.extend_from_slice(&port.to_be_bytes());
            v.extend_from_slice(&[0, 0]);
            v
        }
        MapKey::NodePort(p, port) => {
            let mut v = vec![proto_num(*p), 0, 0, 0];
            v.extend_from_slice(&port.to_be_bytes());
            v.extend_from_slice(&[0, 0]);
            v
        }
        MapKey::Addr(ip) => ip.octets().to_vec(),
    }
}

/// Adds `ops` (each in its table) to `batch`, grouping consecutive element
/// changes of one map into one message.
pub fn encode_ops(batch: &mut Batch, ops: &[(String, Op)]) {
    let mut i = 0;
    while i < ops.len() {
        let (table, op) = &ops[i];
        match op {
            Op::AddElement(map, ..) | Op::DeleteElement(map, ..) => {
                let add = matches!(op, Op::AddElement(..));
                let mut j = i;
                let mut adds: Vec<(&MapKey, &Verdict)> = vec![];
                let mut dels: Vec<&MapKey> = vec![];
                while j < ops.len() && &ops[j].0 == table {
                    match &ops[j].1 {
                        Op::AddElement(m, k, v) if add && m == map => adds.push((k, v)),
                        Op::DeleteElement(m, k) if !add && m == map => dels.push(k),
                        _ => break,
                    }
                    j += 1;
                }
                if add {
                    batch.add_map_elements(table, map, &adds);
                } else {
                    batch.delete_map_elements(table, map, &dels);
                }
                i = j;
                continue;
            }
            Op::AddSet(name, timeout) => batch.add_addr_set(table, name, Some(*timeout)),
            Op::AddChain(c) => batch.add_chain(table, c, None),
            Op::FlushChain(c) => batch.flush_chain(table, c),
            Op::AddRule(c, r) => batch.add_rule(table, c, r),
            Op::DeleteChain(c) => batch.delete_chain(table, c),
            Op::DeleteSet(s) => batch.delete_set(table, s),
            Op::AddHairpin(ip) => batch.hairpin(table, &[*ip], false),
            Op::DeleteHairpin(ip) => batch.hairpin(table, &[*ip], true),
            Op::AddDnatMap(m, p, k) => batch.add_dnat_map(table, m, *p, *k),
            Op::FlushDnatMap(m) => batch.flush_set(table, m),
            Op::FillDnatMap(m, eps) => batch.fill_dnat_map(table, m, eps),
        }
        i += 1;
    }
}

/// The skeleton of table `name` (`home`): its maps, sets and fixed chains.
pub fn encode_skeleton(
    batch: &mut Batch,
    name: &str,
    home: Home,
    node_ips: &[Ipv4Addr],
    cluster_cidr: Option<(Ipv4Addr, u8)>,
    hairpin_size: u32,
) {
    let (maps, skeleton) = match home {
        Home::Main => (&rules::MAPS[..], rules::skeleton()),
        Home::Shard(_) => (&rules::SHARD_MAPS[..], rules::shard_skeleton(cluster_cidr)),
    };
    for (map, by_ip) in maps {
        batch.add_service_map(name, map, *by_ip);
    }
    if home == Home::Main {
        for map in [
            super::policy::model::POLICY_INGRESS,
            super::policy::model::POLICY_EGRESS,
        ] {
            batch.add_addr_map(name, map);
        }
        batch.add_pair_set(name, rules::HAIRPIN, hairpin_size);
    }
    batch.add_addr_set(name, rules::NODEPORT_IPS, None);
    if !node_ips.is_empty() {
        batch.add_addrs(name, rules::NODEPORT_IPS, node_ips);
    }
    for (chain, hook, _) in &skeleton {
        batch.add_chain(name, chain, hook.as_ref());
    }
    for (chain, _, rules) in &skeleton {
        for r in rules {
            batch.add_rule(name, chain, r);
        }
    }
}

/// Why the kernel refused a batch, or why it could not be sent.
#[derive(Debug)]
pub enum SendError {
    /// The kernel refused the transaction (nothing of it applied).
    Refused(String),
    /// The socket could not be opened or written.
    Io(std::io::Error),
}

/// Sends a finished batch and collects the kernel's verdict. The kernel
/// handles a batch within the `send` call, so its errors are queued on
/// the socket when `send` returns (as `nft` reads them).
pub fn send(bytes: &[u8], what: &[String]) -> Result<(), SendError> {
    use netlink_sys::{protocols::NETLINK_NETFILTER, Socket, SocketAddr};
    let mut sock = Socket::new(NETLINK_NETFILTER).map_err(SendError::Io)?;
    sock.bind_auto().map_err(SendError::Io)?;
    sock.connect(&SocketAddr::new(0, 0))
        .map_err(SendError::Io)?;
    // A whole-ruleset batch is megabytes; netlink refuses a message larger
    // than the socket's send buffer.
    if bytes.len() > 128 * 1024 {
        let size = bytes.len() + 64 * 1024;
        nix::sys::socket::setsockopt(&sock, nix::sys::socket::sockopt::SndBufForce, &size)
            .map_err(|e| SendError::Io(e.into()))?;
    }
    let n = sock.send(bytes, 0).map_err(SendError::Io)?;
    if n != bytes.len() {
        return Err(SendError::Io(std::io::Error::other("short netlink send")));
    }
    sock.set_non_blocking(true).map_err(SendError::Io)?;
    let mut errors = vec![];
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match sock.recv(&mut &mut buf[..], 0) {
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
            Err(e) => return Err(SendError::Io(e)),
        };
        if n == 0 {
            break;
        }
        let mut off = 0;
        while off + 16 <= n {
            let len = u32::from_ne_bytes(buf[off..off + 4].try_into().expect("4 bytes")) as usize;
            let ty = u16::from_ne_bytes([buf[off + 4], buf[off + 5]]);
            if len < 16 || off + len > n {
                break;
            }
            if ty == NLMSG_ERROR && len >= 20 {
                let code = i32::from_ne_bytes(buf[off + 16..off + 20].try_into().expect("4 bytes"));
                if code != 0 {
                    // The header of the refused message follows the code.
                    let seq = if len >= 32 {
                        u32::from_ne_bytes(buf[off + 28..off + 32].try_into().expect("4 bytes"))
                    } else {
                        u32::MAX
                    };
                    let err = std::io::Error::from_raw_os_error(-code);
                    let msg = what
                        .get(seq as usize)
                        .filter(|w| !w.is_empty())
                        .cloned()
                        .unwrap_or_else(|| format!("message {seq}"));
                    errors.push(format!("{msg}: {err}"));
                }
            }
            off += (len + 3) & !3;
        }
    }
    if errors.is_empty() {
        Ok(())
    } else {
        errors.truncate(4);
        Err(SendError::Refused(errors.join(" | ")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A netlink message as bytes, built independently of [`Batch`].
    fn message(ty: u16, flags: u16, seq: u32, family: u8, res_id: u16, attrs: &[u8]) -> Vec<u8> {
        let mut m = vec![];
        m.extend_from_slice(&((20 + attrs.len()) as u32).to_ne_bytes());
        m.extend_from_slice(&ty.to_ne_bytes());
        m.extend_from_slice(&flags.to_ne_bytes());
        m.extend_from_slice(&seq.to_ne_bytes());
        m.extend_from_slice(&0u32.to_ne_bytes());
        m.extend_from_slice(&[family, 0]);
        m.extend_from_slice(&res_id.to_be_bytes());
        m.extend_from_slice(attrs);
        m
    }

    fn attr(ty: u16, data: &[u8]) -> Vec<u8> {
        let mut a = vec![];
        a.extend_from_slice(&((4 + data.len()) as u16).to_ne_bytes());
        a.extend_from_slice(&ty.to_ne_bytes());
        a.extend_from_slice(data);
        while a.len() % 4 != 0 {
            a.push(0);
        }
        a
    }

    fn be(v: u32) -> [u8; 4] {
        v.to_be_bytes()
    }

    /// The bytes `nft -j -f` 1.0.6 sent (read with strace) for a table
    /// and a verdict map keyed by `ipv4_addr . inet_proto . inet_service`.
    #[test]
    fn a_table_and_a_service_map_are_the_messages_nft_sends() {
        let mut b = Batch::new();
        b.add_table("zzs");
        b.add_service_map("zzs", "service-ips", true);
        let (bytes, what) = b.finish();

        let mut want = message(0x10, 1, 0, 0, 10, &[]);
        let table = [attr(1, b"zzs\0"), attr(2, &be(0))].concat();
        want.extend(message(0x0a00, 1, 1, 2, 0, &table));
        let set = [
            attr(1, b"zzs\0"),
            attr(2, b"service-ips\0"),
            attr(3, &be(8)),
            attr(4, &be(0x730d)),
            attr(5, &be(12)),
            attr(6, &be(0xffff_ff00)),
            attr(7, &be(0)),
            attr(10, &be(1)),
            attr(
                13,
                &[
                    0x00, 0x04, 0x00, 0x00, 0x00, 0x00, 0x01, 0x04, 0x00, 0x00, 0x00, 0x00, 0x03,
                    0x08, 0x00, 0x04, 0x0d, 0x00, 0x00, 0x00, 0x01, 0x00, 0x06, 0x04, 0x00, 0x00,
                    0x00, 0x00,
                ],
            ),
        ]
        .concat();
        assert_eq!(set.len(), 104);
        want.extend(message(0x0a09, 0x401, 2, 2, 0, &set));
        want.extend(message(0x11, 1, 3, 0, 10, &[]));
        assert_eq!(bytes, want);
        assert_eq!(what[1], "add table ip zzs");
    }

    /// `delete element` of a `proto . port` key: each field in a 32-bit
    /// word, the port big-endian (as nft sent `tcp . 30080`).
    #[test]
    fn a_nodeport_key_is_padded_per_field() {
        assert_eq!(
            key_bytes(&MapKey::NodePort(Protocol::Tcp, 30080)),
            vec![6, 0, 0, 0, 0x75, 0x80, 0, 0]
        );
        assert_eq!(
            key_bytes(&MapKey::Ip(Ipv4Addr::new(10, 43, 0, 20), Protocol::Udp, 53)),
            vec![10, 43, 0, 20, 17, 0, 0, 0, 0, 53, 0, 0]
        );
    }

    #[test]
    fn big_element_lists_are_split_over_messages_of_one_batch() {
        let mut b = Batch::new();
        let ips: Vec<Ipv4Addr> = (0..1000u32)
            .map(|i| Ipv4Addr::from(0xc612_0000 + i))
            .collect();
        b.hairpin("t", &ips, false);
        // Begin, three element messages (400 + 400 + 200), end.
        assert_eq!(b.messages(), 4);
        let (bytes, _) = b.finish();
        let mut off = 0;
        let mut n = 0;
        while off < bytes.len() {
            let len = u32::from_ne_bytes(bytes[off..off + 4].try_into().unwrap()) as usize;
            assert!(len < 65536);
            off += len;
            n += 1;
        }
        assert_eq!(off, bytes.len());
        assert_eq!(n, 5);
    }

    #[test]
    fn rules_that_match_nothing_are_not_written() {
        use crate::proxy::policy::model::Field;
        let allow = |addr| {
            Rule::Allow(Allow {
                field: Field::Saddr,
                addr,
                protocol: None,
                ports: None,
            })
        };
        assert!(matches_nothing(&allow(Addr::Set(vec![]))));
        assert!(matches_nothing(&Rule::EgressCheckTo(vec![])));
        assert!(matches_nothing(&allow(Addr::Block(
            (Ipv4Addr::new(10, 0, 0, 0), 8),
            vec![(Ipv4Addr::UNSPECIFIED, 0)]
        ))));
        assert!(!matches_nothing(&allow(Addr::Set(vec![
            Ipv4Addr::LOCALHOST
        ]))));
        assert!(!matches_nothing(&allow(Addr::Any)));
        assert!(!matches_nothing(&Rule::Masquerade));
        let mut b = Batch::new();
        b.add_rule("t", "c", &allow(Addr::Set(vec![])));
        b.add_rule("t", "c", &Rule::EgressCheckTo(vec![]));
        assert!(b.is_empty());
        b.add_rule("t", "c", &allow(Addr::Any));
        assert_eq!(b.messages(), 2);
    }
}
