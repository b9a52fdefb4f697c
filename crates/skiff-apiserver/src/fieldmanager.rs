//! Managed-fields bookkeeping for non-apply writes: which manager set which
//! fields (`metadata.managedFields`), delegated to the core's apply logic.

use serde_json::Value;
use skiff_core::resources::ResourceInfo;

/// Records that `manager` wrote `new` over `old` (operation Update).
pub fn record(
    res: &ResourceInfo,
    old: Option<&Value>,
    new: &mut Value,
    manager: &str,
    sub: Option<&str>,
) {
    let schema = skiff_core::schema::root(res.group, res.version, res.kind);
    skiff_core::patch::apply::record_update(
        old,
        new,
        manager,
        "Update",
        sub,
        schema,
        &crate::object::now_rfc3339(),
        &res.api_version(),
    );
}
