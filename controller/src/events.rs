//! Events: the runtime's bounded queue and de-duplicating recorder, written only while this
//! replica leads.

pub use ferrolb_runtime::events::{EventQueue, Note, Queued, Recorder};

use crate::leader::Leadership;

impl ferrolb_runtime::events::WriteGate for Leadership {
    fn may_write(&self) -> bool {
        self.is_leading()
    }
}
