//! Processes recorded in the lab's state after it is up (ferrolb's controllers and speakers):
//! tracking, stopping and restarting them by name.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::Context;

use super::*;
use crate::process::{self, LabProcess};

impl Lab {
    /// Records a process the lab did not start itself (e.g. the demo's controller), so `down`
    /// stops it. A recorded process of the same name that no longer runs is forgotten: the new
    /// one takes its place.
    pub fn track_process(&self, process: LabProcess) -> anyhow::Result<()> {
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        state
            .processes
            .retain(|p| p.name != process.name || process::running(p));
        state.processes.push(process);
        state.save(&self.dir)
    }

    /// Stops every recorded process named `name` that still runs (by PID) and forgets it.
    pub fn stop_process(&self, name: &str) -> anyhow::Result<()> {
        let victims: Vec<LabProcess> = {
            let _guard = STATE_LOCK
                .lock()
                .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
            let state = State::load(&self.dir)?.context("the lab is not up")?;
            state
                .processes
                .iter()
                .filter(|p| p.name == name)
                .cloned()
                .collect()
        };
        for p in &victims {
            process::stop(p, Duration::from_secs(5));
        }
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        state.processes.retain(|p| !victims.contains(p));
        state.save(&self.dir)
    }

    /// Stops the recorded process `name` (by PID) and keeps its record: an outage of one
    /// component (the API server, etcd) that the caller ends with [`Outage::end`], or that
    /// ends when the guard is dropped (a failing test leaves the lab whole).
    pub fn stop_keeping(&self, name: &str) -> anyhow::Result<Outage<'_>> {
        process::stop(&self.recorded(name)?, Duration::from_secs(5));
        Ok(Outage {
            lab: self,
            name: name.to_string(),
            ended: false,
        })
    }

    /// [`Self::stop_keeping`] with SIGKILL: the component crashes, and starts again when the
    /// outage ends.
    pub fn kill_keeping(&self, name: &str) -> anyhow::Result<Outage<'_>> {
        process::kill_now(&self.recorded(name)?);
        Ok(Outage {
            lab: self,
            name: name.to_string(),
            ended: false,
        })
    }

    /// The latest recorded process named `name`.
    fn recorded(&self, name: &str) -> anyhow::Result<LabProcess> {
        let state = State::load(&self.dir)?.context("the lab is not up")?;
        state
            .processes
            .iter()
            .rev()
            .find(|p| p.name == name)
            .cloned()
            .with_context(|| {
                let names: Vec<&str> = state.processes.iter().map(|p| p.name.as_str()).collect();
                format!("no lab process {name:?}; the lab has: {}", names.join(", "))
            })
    }

    /// Starts the recorded process `name` again with the command it was started with (stopping
    /// it first if it still runs), appending to the same log; returns the new process.
    pub fn restart(&self, name: &str) -> anyhow::Result<LabProcess> {
        let old = self.recorded(name)?;
        let spec = old.command.clone().with_context(|| {
            format!("{name} was recorded without its command line: start it the way it was started")
        })?;
        if process::running(&old) {
            process::stop(&old, Duration::from_secs(5));
        }
        let log = PathBuf::from(&old.log);
        let new = process::start(&self.lab_exe, name, old.kind, &spec, &log)?;
        let _guard = STATE_LOCK
            .lock()
            .map_err(|_| anyhow::anyhow!("state lock poisoned"))?;
        let mut state = State::load(&self.dir)?.context("the lab is not up")?;
        match state.processes.iter_mut().find(|p| **p == old) {
            Some(slot) => *slot = new.clone(),
            None => state.processes.push(new.clone()),
        }
        state.save(&self.dir)?;
        Ok(new)
    }
}

/// A lab component stopped by [`Lab::stop_keeping`]: started again by [`Outage::end`], or on
/// drop.
#[must_use = "the component starts again when the outage is dropped"]
pub struct Outage<'a> {
    lab: &'a Lab,
    name: String,
    ended: bool,
}

impl Outage<'_> {
    /// Starts the component again.
    pub fn end(mut self) -> anyhow::Result<()> {
        self.ended = true;
        self.lab.restart(&self.name)?;
        Ok(())
    }
}

impl Drop for Outage<'_> {
    fn drop(&mut self) {
        if !self.ended {
            let _ = self.lab.restart(&self.name);
        }
    }
}
