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

/// [`Plain`], with `metadata.generation` tracking spec changes (the
/// `apps`, `autoscaling` and `policy` kinds without other rules).
pub struct PlainGenerational;

impl KindRules for PlainGenerational {
    fn kind(&self) -> &'static str {
        "Plain"
    }

    fn tracks_generation(&self) -> bool {
        true
    }
}

/// A kind whose only rule is answering a delete with the deleted object.
pub struct ReturnsDeleted(pub &'static str);

impl KindRules for ReturnsDeleted {
    fn kind(&self) -> &'static str {
        self.0
    }

    fn returns_deleted_object(&self) -> bool {
        true
    }
}
