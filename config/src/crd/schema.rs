//! Hand-built schema pieces for rules that schemars attributes cannot express: CEL rules on list
//! items, list types, and string limits that keep CEL's estimated cost inside the API server's
//! budget.

use schemars::{Schema, SchemaGenerator, json_schema};
use serde_json::{Value, json};

/// Longest address entry we accept: two full IPv6 addresses around a dash, with room for spaces.
const MAX_ADDRESS_LEN: u32 = 128;

fn rules(list: &[(&str, &str)]) -> Value {
    Value::Array(
        list.iter()
            .map(|(rule, message)| json!({"rule": rule, "message": message}))
            .collect(),
    )
}

/// CEL expression for the 32-bit value of a dotted IPv4 string expression `s`.
fn v4_value(s: &str) -> String {
    let part = |i: usize| format!("int({s}.split('.')[{i}])");
    format!(
        "({} * 16777216 + {} * 65536 + {} * 256 + {})",
        part(0),
        part(1),
        part(2),
        part(3)
    )
}

/// Schema of `IPAddressPool.spec.addresses`: a non-empty set of CIDRs or `first-last` ranges.
pub(crate) fn pool_addresses(_: &mut SchemaGenerator) -> Schema {
    let first = "self.split('-')[0].trim()";
    let last = "self.split('-')[1].trim()";
    let is_range = format!(
        "self.contains('-') && size(self.split('-')) == 2 && isIP({first}) && isIP({last})"
    );
    let syntax = format!("self.contains('-') ? ({is_range}) : isCIDR(self)");
    let family = format!("!({is_range}) || ip({first}).family() == ip({last}).family()");
    let order = format!(
        "!({is_range}) || ip({first}).family() != 4 || ip({last}).family() != 4 || {} <= {}",
        v4_value(first),
        v4_value(last)
    );
    json_schema!({
        "type": "array",
        "minItems": 1,
        "maxItems": 1024,
        "x-kubernetes-list-type": "set",
        "description": "Addresses of the pool: CIDRs (198.51.100.0/24, 2001:db8::/64) or ranges first-last (198.51.100.10-198.51.100.20).",
        "items": {
            "type": "string",
            "maxLength": MAX_ADDRESS_LEN,
            "x-kubernetes-validations": rules(&[
                (&syntax, "must be a CIDR such as 198.51.100.0/24 or a range first-last such as 198.51.100.10-198.51.100.20"),
                (&family, "both ends of a range must be of the same IP family"),
                (&order, "the first address of a range must not be after the last"),
            ]),
        },
    })
}

/// A set of names (pools, peers, interfaces, namespaces): duplicates are rejected by the API server.
pub(crate) fn name_set(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "set",
        "maxItems": 1024,
        "items": {"type": "string", "maxLength": 253},
    })
}

/// BGP communities in an advertisement: `a:b`, `large:a:b:c`, or the name of a Community alias.
pub(crate) fn community_refs(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "set",
        "maxItems": 1024,
        "items": {"type": "string", "maxLength": 128, "minLength": 1},
    })
}

/// An IPv4 or IPv6 address string (peer, source address).
pub(crate) fn ip_address(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 64,
        "x-kubernetes-validations": rules(&[("isIP(self)", "must be an IPv4 or IPv6 address")]),
    })
}

/// A BGP router ID: a dotted-quad IPv4 address.
pub(crate) fn router_id(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 15,
        "x-kubernetes-validations": rules(&[(
            "isIP(self) && ip(self).family() == 4",
            "must be an IPv4 address such as 10.0.0.1",
        )]),
    })
}

/// A Go-style duration string (`90s`, `1m30s`), as in MetalLB's metav1.Duration fields.
pub(crate) fn duration(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "maxLength": 32,
        "pattern": "^([0-9]+(\\.[0-9]+)?(ns|us|µs|ms|s|m|h))+$",
    })
}

/// A BGP community value: `a:b` (16 bits each) or `large:a:b:c` (32 bits each).
pub(crate) fn community_value(_: &mut SchemaGenerator) -> Schema {
    let parts = "self.split(':')";
    let standard = format!(
        "!self.startsWith('large:') ? (size({parts}) == 2 && {parts}.all(p, int(p) <= 65535)) : true"
    );
    let large = format!(
        "self.startsWith('large:') ? (size({parts}) == 4 && int({parts}[1]) <= 4294967295 && int({parts}[2]) <= 4294967295 && int({parts}[3]) <= 4294967295) : true"
    );
    json_schema!({
        "type": "string",
        "maxLength": 40,
        "pattern": "^([0-9]{1,5}:[0-9]{1,5}|large:[0-9]{1,10}:[0-9]{1,10}:[0-9]{1,10})$",
        "x-kubernetes-validations": rules(&[
            (&standard, "a standard community is a:b with each part at most 65535"),
            (&large, "a large community is large:a:b:c with each part at most 4294967295"),
        ]),
    })
}
