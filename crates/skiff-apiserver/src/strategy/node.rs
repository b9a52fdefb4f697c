//! Nodes keep the status they are created with: the node agent registers
//! its node with its status in one create.

use skiff_core::resources::ResourceInfo;

use super::Strategy;

pub struct NodeStrategy;

impl Strategy for NodeStrategy {
    fn prepare_for_create(&self, _res: &ResourceInfo, _obj: &mut serde_json::Value) {}
}
