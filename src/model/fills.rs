//! Staging fills off the submitting thread: a small pool of worker threads copies experts
//! from the host source into staging buffers while the submitting thread keeps the device
//! busy (a layer's hits, the next layer's attention), and a watcher thread that notes
//! when a submission completes, so the time the device waited for a copy can be counted.
//!
//! With no worker threads every fill runs on the caller's thread when it is queued (the
//! fills of a step then never overlap the device's work for that layer).

use std::collections::HashMap;
use std::sync::mpsc::{self, Receiver, Sender, SyncSender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::backend::{Device, Staging};
use crate::error::{Error, Result};
use crate::residency::HostSource;

/// One fill: expert `expert` of `layer` into staging buffer `staging`; `fail`: the test
/// hook's injected mapping failure instead (naming the kind of copy).
struct Job {
    id: u64,
    layer: usize,
    expert: u32,
    staging: usize,
    fail: Option<&'static str>,
}

struct Done {
    id: u64,
    result: Result<()>,
    at: Instant,
}

/// What the workers and the inline path share.
#[derive(Clone)]
struct Shared {
    dev: Device,
    host: Arc<HostSource>,
    staging: Arc<[Staging]>,
}

impl Shared {
    fn run(&self, j: &Job) -> Result<()> {
        if let Some(kind) = j.fail {
            return Err(Error::Gpu(format!(
                "injected failure: staging map for expert {} of layer {} ({kind})",
                j.expert, j.layer
            )));
        }
        let Some(buf) = self.staging.get(j.staging) else {
            return Err(Error::Other(format!(
                "internal: staging buffer {} does not exist",
                j.staging
            )));
        };
        self.dev
            .fill_staging(buf, self.host.expert(j.layer, j.expert)?)
    }
}

/// A submission to watch, and where to say when it completed.
type Watch = (u64, Sender<Result<Instant>>);

pub struct FillPool {
    shared: Shared,
    jobs: Option<Sender<Job>>,
    done_tx: Sender<Done>,
    done: Receiver<Done>,
    stash: HashMap<u64, Done>,
    workers: Vec<JoinHandle<()>>,
    next: u64,
    watcher: Option<(SyncSender<Watch>, JoinHandle<()>)>,
}

/// The completion of a watched submission, read once it is known to have completed.
pub struct Ticket(Receiver<Result<Instant>>);

impl Ticket {
    /// When the watcher saw the submission complete (blocks until it did).
    pub fn completed_at(self) -> Result<Instant> {
        self.0
            .recv()
            .unwrap_or_else(|_| Err(Error::Other("the fence watcher stopped".into())))
    }
}

impl FillPool {
    /// `threads` fill workers (0: fills run on the caller's thread).
    pub fn new(
        dev: &Device,
        host: Arc<HostSource>,
        staging: Arc<[Staging]>,
        threads: usize,
    ) -> Result<Self> {
        let shared = Shared {
            dev: dev.clone(),
            host,
            staging,
        };
        let (done_tx, done) = mpsc::channel();
        let mut workers = Vec::new();
        let jobs = if threads > 0 {
            let (tx, rx) = mpsc::channel::<Job>();
            let rx = Arc::new(Mutex::new(rx));
            for i in 0..threads {
                let (rx, sh, out) = (rx.clone(), shared.clone(), done_tx.clone());
                let h = std::thread::Builder::new()
                    .name(format!("wgmoe-fill-{i}"))
                    .spawn(move || loop {
                        let job = match rx.lock() {
                            Ok(r) => r.recv(),
                            Err(_) => return,
                        };
                        let Ok(job) = job else { return };
                        let result = sh.run(&job);
                        let _ = out.send(Done {
                            id: job.id,
                            result,
                            at: Instant::now(),
                        });
                    })
                    .map_err(|e| Error::Other(format!("staging fill threads: {e}")))?;
                workers.push(h);
            }
            Some(tx)
        } else {
            None
        };
        let (wtx, wrx) = mpsc::sync_channel::<Watch>(0);
        let wdev = dev.clone();
        let watcher = std::thread::Builder::new()
            .name("wgmoe-fence-watch".into())
            .spawn(move || {
                while let Ok((token, reply)) = wrx.recv() {
                    let r = wdev.wait(token).map(|_| Instant::now());
                    let _ = reply.send(r);
                }
            })
            .map_err(|e| Error::Other(format!("fence watcher thread: {e}")))?;
        Ok(FillPool {
            shared,
            jobs,
            done_tx,
            done,
            stash: HashMap::new(),
            workers,
            next: 1,
            watcher: Some((wtx, watcher)),
        })
    }

    /// Worker threads (0: fills on the caller's thread).
    pub fn threads(&self) -> usize {
        self.workers.len()
    }

    /// Queue a fill; returns its id for [`wait`](Self::wait). Without workers it runs now.
    pub fn fill(
        &mut self,
        layer: usize,
        expert: u32,
        staging: usize,
        fail: Option<&'static str>,
    ) -> u64 {
        let id = self.next;
        self.next += 1;
        let job = Job {
            id,
            layer,
            expert,
            staging,
            fail,
        };
        let job = match &self.jobs {
            Some(tx) => match tx.send(job) {
                Ok(()) => return id,
                // Every worker is gone (a panic): run it here.
                Err(mpsc::SendError(job)) => job,
            },
            None => job,
        };
        let result = self.shared.run(&job);
        let _ = self.done_tx.send(Done {
            id,
            result,
            at: Instant::now(),
        });
        id
    }

    fn drain(&mut self) {
        while let Ok(d) = self.done.try_recv() {
            self.stash.insert(d.id, d);
        }
    }

    /// Whether every fill of `ids` has finished (never blocks).
    pub fn all_done(&mut self, ids: &[u64]) -> bool {
        self.drain();
        ids.iter().all(|i| self.stash.contains_key(i))
    }

    /// Wait for every fill of `ids`: the first failure (after all have finished, so every
    /// staging buffer is settled) or when the last one finished.
    pub fn wait(&mut self, ids: &[u64]) -> Result<Instant> {
        let mut last: Option<Instant> = None;
        let mut failure = None;
        for id in ids {
            let d = loop {
                if let Some(d) = self.stash.remove(id) {
                    break d;
                }
                match self.done.recv() {
                    Ok(d) => {
                        self.stash.insert(d.id, d);
                    }
                    Err(_) => return Err(Error::Other("the staging fill threads stopped".into())),
                }
            };
            last = Some(last.map_or(d.at, |t| t.max(d.at)));
            if let (Err(e), None) = (d.result, &failure) {
                failure = Some(e);
            }
        }
        match failure {
            Some(e) => Err(e),
            None => Ok(last.unwrap_or_else(Instant::now)),
        }
    }

    /// Note when submission `token` completes (the watcher has taken it when this returns).
    pub fn watch(&self, token: u64) -> Result<Ticket> {
        let Some((tx, _)) = &self.watcher else {
            return Err(Error::Other("the fence watcher stopped".into()));
        };
        let (reply, rx) = mpsc::channel();
        tx.send((token, reply))
            .map_err(|_| Error::Other("the fence watcher stopped".into()))?;
        Ok(Ticket(rx))
    }
}

impl Drop for FillPool {
    fn drop(&mut self) {
        self.jobs = None;
        for h in self.workers.drain(..) {
            let _ = h.join();
        }
        if let Some((tx, h)) = self.watcher.take() {
            drop(tx);
            let _ = h.join();
        }
    }
}
