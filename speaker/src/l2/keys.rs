//! The gossip keys: read from their files at start, then polled so a changed Secret takes effect
//! without a restart and without dropping any peer.
//!
//! Two files, both keys of one Secret mounted as a directory: `secretkey` (MetalLB's memberlist
//! Secret has the same key, so that Secret keeps working) signs and verifies; `nextkey`, when
//! present and not empty, is accepted as well. Each file is one key, its whole content but the
//! trailing whitespace (a key made with `openssl rand -base64 128`, as MetalLB's docs suggest,
//! spans several lines and stays one key). Rotation: add `nextkey` everywhere, swap the two,
//! remove `nextkey` (docs/architecture.md, "Rotating the gossip key").
//!
//! The files are read every [`POLL`] and compared by content: the kubelet updates a Secret
//! volume by swapping a symlink, which changes no modification time a poll could rely on. A key
//! file that cannot be read, or that holds a key shorter than 16 bytes, keeps the last good keys
//! (a warning, and `ferrolb_speaker_gossip_key_reloads_total{result}`): a Secret edited into a
//! bad state must not cut this node off from the others.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use ferrolb_layer2::heartbeat::{KeyError, KeyRing, MIN_KEY_LEN};

use crate::l2::gossip::Gossip;
use crate::metrics::Metrics;

/// How often the key files are read. A Secret change reaches the volume after the kubelet's
/// sync (up to a minute or so); a few seconds more is noise, and two small reads are cheap.
pub const POLL: Duration = Duration::from_secs(5);

/// Where the keys are.
#[derive(Clone, Debug)]
pub struct KeyFiles {
    /// The signing key (`secretkey`).
    pub key: PathBuf,
    /// The key also accepted during a rotation (`nextkey`); a missing or empty file: none.
    pub next: Option<PathBuf>,
}

/// Why the key files give no usable keys.
#[derive(Debug, thiserror::Error)]
pub enum KeyFileError {
    /// The file is missing (for the signing key) or cannot be read.
    #[error("cannot read the gossip key file {}: {source}", path.display())]
    Unreadable {
        /// The file.
        path: PathBuf,
        /// What reading it said.
        source: std::io::Error,
    },
    /// The key is too short to authenticate anything.
    #[error("the gossip key in {} is {len} bytes long; at least {MIN_KEY_LEN} are needed", path.display())]
    TooShort {
        /// The file.
        path: PathBuf,
        /// The key's length, trailing whitespace removed.
        len: usize,
    },
}

impl KeyFileError {
    /// The `result` label of `ferrolb_speaker_gossip_key_reloads_total`.
    pub fn result(&self) -> &'static str {
        match self {
            KeyFileError::Unreadable { .. } => "unreadable",
            KeyFileError::TooShort { .. } => "invalid",
        }
    }
}

impl KeyFiles {
    /// Reads both files into a key ring (the signing key first).
    pub fn read(&self) -> Result<KeyRing, KeyFileError> {
        let key = std::fs::read(&self.key).map_err(|source| KeyFileError::Unreadable {
            path: self.key.clone(),
            source,
        })?;
        let next = match &self.next {
            None => None,
            Some(path) => match std::fs::read(path) {
                Ok(bytes) => Some(bytes),
                // Removing `nextkey` from the Secret is the last step of a rotation.
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
                Err(source) => {
                    return Err(KeyFileError::Unreadable {
                        path: path.clone(),
                        source,
                    });
                }
            },
        };
        self.ring(key, next)
    }

    /// The ring from the files' contents: trailing whitespace removed (`kubectl create secret
    /// --from-file` keeps a final newline), an empty next key taken as none.
    fn ring(&self, key: Vec<u8>, next: Option<Vec<u8>>) -> Result<KeyRing, KeyFileError> {
        let next = next.map(trim_key).filter(|k| !k.is_empty());
        KeyRing::new([trim_key(key)].into_iter().chain(next)).map_err(|e| match e {
            KeyError::TooShort { index, len } => KeyFileError::TooShort {
                path: self.path(index).to_path_buf(),
                len,
            },
            // A ring always gets the signing key.
            KeyError::Empty => KeyFileError::TooShort {
                path: self.key.clone(),
                len: 0,
            },
        })
    }

    fn path(&self, index: usize) -> &Path {
        match (index, &self.next) {
            (0, _) | (_, None) => &self.key,
            (_, Some(next)) => next,
        }
    }
}

/// A key file may end in a newline (`kubectl create secret --from-file` keeps it).
fn trim_key(mut key: Vec<u8>) -> Vec<u8> {
    while key.last().is_some_and(|b| b.is_ascii_whitespace()) {
        key.pop();
    }
    key
}

/// What one poll of the files found.
#[derive(Debug)]
pub enum Poll {
    /// The keys in use are those of the files.
    Unchanged,
    /// The files hold other keys (valid): use them.
    Changed(KeyRing),
    /// The files give no usable keys: keep the last good ones. `first` is true when this
    /// failure differs from the last one seen (worth a warning; the same one again is not).
    Kept {
        /// What is wrong with the files.
        error: KeyFileError,
        /// Not the failure of the previous poll.
        first: bool,
    },
}

/// Compares the files with the keys in use, remembering the last failure so a file that stays
/// broken is warned about once.
#[derive(Debug, Default)]
pub struct Reloader {
    failure: Option<String>,
}

impl Reloader {
    /// Looks at what the files gave (`read`) against the keys in use.
    pub fn poll(&mut self, read: Result<KeyRing, KeyFileError>, in_use: &KeyRing) -> Poll {
        match read {
            Ok(ring) => {
                self.failure = None;
                if &ring == in_use {
                    Poll::Unchanged
                } else {
                    Poll::Changed(ring)
                }
            }
            Err(error) => {
                let text = error.to_string();
                let first = self.failure.as_deref() != Some(text.as_str());
                self.failure = Some(text);
                Poll::Kept { error, first }
            }
        }
    }

    /// Whether the last poll failed (the next good one is worth a line in the log).
    pub fn failing(&self) -> bool {
        self.failure.is_some()
    }
}

/// Polls the key files for as long as the speaker runs and hands changed keys to the heartbeat
/// exchange.
pub async fn keep_reloading(files: KeyFiles, gossip: Arc<Gossip>, metrics: Metrics) {
    let mut reloader = Reloader::default();
    let mut tick = tokio::time::interval(POLL);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The first tick is immediate; the keys were just read at start.
    tick.tick().await;
    loop {
        tick.tick().await;
        let was_failing = reloader.failing();
        let in_use = gossip.keys();
        match reloader.poll(files.read(), &in_use) {
            Poll::Unchanged => {
                if was_failing {
                    tracing::info!(file = %files.key.display(), "the gossip key files are readable again; keys unchanged");
                }
            }
            Poll::Changed(ring) => {
                metrics
                    .gossip_key_reloads
                    .get_or_create(&vec![("result", "applied".to_string())])
                    .inc();
                let signing_changed = ring.signing() != in_use.signing();
                if signing_changed && !ring.contains(in_use.signing()) {
                    // Nodes that have not reloaded yet sign with the key this node just dropped.
                    tracing::warn!(
                        keys = ring.len(),
                        "the gossip key changed without a rotation: until every node has the new key, nodes refuse each other's heartbeats (rotate through `nextkey`: docs/architecture.md)"
                    );
                } else {
                    tracing::info!(
                        keys = ring.len(),
                        signing_key_changed = signing_changed,
                        "gossip keys reloaded"
                    );
                }
                gossip.set_keys(ring);
            }
            Poll::Kept { error, first } => {
                metrics
                    .gossip_key_reloads
                    .get_or_create(&vec![("result", error.result().to_string())])
                    .inc();
                if first {
                    tracing::warn!(error = %error, keys = in_use.len(), "keeping the last good gossip keys");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;

    const KEY: &[u8] = b"0123456789abcdef0123456789abcdef";
    const NEXT: &[u8] = b"fedcba9876543210fedcba9876543210";

    /// A directory laid out as the kubelet lays out a Secret volume: the keys live in a
    /// timestamped directory, `..data` links to it, and each key is a link through `..data`.
    /// An update writes a new directory and swaps `..data` atomically.
    struct SecretVolume {
        dir: PathBuf,
        generation: u32,
    }

    impl SecretVolume {
        fn new(name: &str) -> Self {
            let dir = std::env::temp_dir().join(format!(
                "ferrolb-keys-{name}-{}-{:?}",
                std::process::id(),
                std::time::SystemTime::now()
            ));
            std::fs::create_dir_all(&dir).unwrap();
            SecretVolume { dir, generation: 0 }
        }

        fn files(&self) -> KeyFiles {
            KeyFiles {
                key: self.dir.join("secretkey"),
                next: Some(self.dir.join("nextkey")),
            }
        }

        fn write(&mut self, data: &[(&str, &[u8])]) {
            self.generation += 1;
            let generation = format!("..gen{}", self.generation);
            std::fs::create_dir(self.dir.join(&generation)).unwrap();
            for (name, value) in data {
                std::fs::write(self.dir.join(&generation).join(name), value).unwrap();
                let link = self.dir.join(name);
                if std::fs::symlink_metadata(&link).is_err() {
                    std::os::unix::fs::symlink(format!("..data/{name}"), &link).unwrap();
                }
            }
            let tmp = self.dir.join("..data_tmp");
            std::os::unix::fs::symlink(&generation, &tmp).unwrap();
            std::fs::rename(&tmp, self.dir.join("..data")).unwrap();
        }
    }

    impl Drop for SecretVolume {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    fn ring(keys: &[&[u8]]) -> KeyRing {
        KeyRing::new(keys.iter().map(|k| k.to_vec())).unwrap()
    }

    #[test]
    fn a_whole_file_is_one_key_and_the_next_key_is_optional() {
        let mut volume = SecretVolume::new("layout");
        // MetalLB's suggested key: several lines of base64, one key.
        let multiline =
            b"bG9uZyBrZXkgbGluZSBvbmUgbG9uZyBrZXkgbGluZSBvbmUgbG9uZyBrZXkgbGlu\nZSBvbmUK\n";
        volume.write(&[("secretkey", multiline)]);
        let keys = volume.files().read().unwrap();
        assert_eq!(keys.len(), 1);
        assert_eq!(keys.signing(), &multiline[..multiline.len() - 1]);
        // An empty nextkey is no key; one equal to the current key is no second key.
        volume.write(&[("secretkey", KEY), ("nextkey", b"\n")]);
        assert_eq!(volume.files().read().unwrap(), ring(&[KEY]));
        volume.write(&[("secretkey", KEY), ("nextkey", KEY)]);
        assert_eq!(volume.files().read().unwrap(), ring(&[KEY]));
        volume.write(&[("secretkey", KEY), ("nextkey", NEXT)]);
        assert_eq!(volume.files().read().unwrap(), ring(&[KEY, NEXT]));
        // Without a next key file configured, only the key.
        let only = KeyFiles {
            next: None,
            ..volume.files()
        };
        assert_eq!(only.read().unwrap(), ring(&[KEY]));
    }

    #[test]
    fn short_keys_are_refused_naming_the_file() {
        let mut volume = SecretVolume::new("short");
        volume.write(&[("secretkey", b"too short\n")]);
        let err = volume.files().read().unwrap_err();
        assert_eq!(err.result(), "invalid");
        let text = err.to_string();
        assert!(
            text.contains("secretkey") && text.contains("9 bytes"),
            "{text}"
        );
        volume.write(&[("secretkey", KEY), ("nextkey", b"short")]);
        let text = volume.files().read().unwrap_err().to_string();
        assert!(
            text.contains("nextkey") && text.contains("5 bytes"),
            "{text}"
        );
        // No file at all: unreadable, naming it.
        let missing = KeyFiles {
            key: volume.dir.join("absent"),
            next: None,
        };
        let err = missing.read().unwrap_err();
        assert_eq!(err.result(), "unreadable");
        assert!(err.to_string().contains("absent"));
    }

    /// The rotation as an operator runs it, each step an atomic swap of the Secret volume, seen
    /// by polls: every change is picked up by content; broken states keep the last good keys.
    #[test]
    fn polls_follow_a_rotation_and_keep_the_last_good_keys() {
        let mut volume = SecretVolume::new("rotation");
        let files = volume.files();
        let mut reloader = Reloader::default();
        volume.write(&[("secretkey", KEY)]);
        let mut in_use = files.read().unwrap();
        let step = |reloader: &mut Reloader, in_use: &mut KeyRing| {
            let poll = reloader.poll(files.read(), in_use);
            if let Poll::Changed(ring) = &poll {
                *in_use = ring.clone();
            }
            poll
        };
        assert!(matches!(step(&mut reloader, &mut in_use), Poll::Unchanged));
        // 1. Add the next key.
        volume.write(&[("secretkey", KEY), ("nextkey", NEXT)]);
        assert!(matches!(step(&mut reloader, &mut in_use), Poll::Changed(_)));
        assert_eq!(in_use, ring(&[KEY, NEXT]));
        // 2. Swap: sign with the new key, still accept the old one.
        volume.write(&[("secretkey", NEXT), ("nextkey", KEY)]);
        step(&mut reloader, &mut in_use);
        assert_eq!(in_use, ring(&[NEXT, KEY]));
        // A broken edit in between: a short key keeps the keys, warned once.
        volume.write(&[("secretkey", b"oops")]);
        assert!(matches!(
            step(&mut reloader, &mut in_use),
            Poll::Kept { first: true, .. }
        ));
        assert!(matches!(
            step(&mut reloader, &mut in_use),
            Poll::Kept { first: false, .. }
        ));
        assert_eq!(in_use, ring(&[NEXT, KEY]));
        // The whole volume gone (unreadable): still the last good keys.
        std::fs::remove_file(volume.dir.join("..data")).unwrap();
        let poll = step(&mut reloader, &mut in_use);
        assert!(
            matches!(&poll, Poll::Kept { error, first: true } if error.result() == "unreadable"),
            "{poll:?}"
        );
        assert_eq!(in_use, ring(&[NEXT, KEY]));
        // 3. Remove the old key.
        volume.write(&[("secretkey", NEXT)]);
        step(&mut reloader, &mut in_use);
        assert_eq!(in_use, ring(&[NEXT]));
        assert!(!reloader.failing());
    }
}
