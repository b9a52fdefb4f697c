//! The rules of kinds with none of their own.

use super::KindRules;

/// No defaults, no checks beyond metadata, name and age columns.
pub struct Plain;

pub static PLAIN: Plain = Plain;

impl KindRules for Plain {
    fn kind(&self) -> &'static str {
        "Plain"
    }
}
