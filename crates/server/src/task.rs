//! A background task that runs until it is told to stop: the sweep, the anomaly detector and
//! the webhook dispatcher.

use std::future::Future;

use tokio::sync::watch;
use tokio::task::JoinHandle;

pub struct Background {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Background {
    /// Spawns `run`, which is handed the stop signal: it turns `true` when the task is to
    /// end, and `run` returns once it has.
    pub fn spawn<F, Fut>(run: F) -> Self
    where
        F: FnOnce(watch::Receiver<bool>) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let (stop, stopped) = watch::channel(false);
        Background {
            stop,
            task: tokio::spawn(run(stopped)),
        }
    }

    /// Signals the task to stop and waits until it has.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
