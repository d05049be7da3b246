//! An output stream onto a file that charges every byte to the job's disk
//! budget before passing it on to wasmtime-wasi's file stream.
//!
//! `write`, `write-zeroes`, `blocking-write-and-flush` (and the host's
//! `splice`, which ends in `write`) are charged; a charge that does not fit
//! fails the call with `last-operation-failed` carrying ENOSPC, which a guest
//! asking `filesystem-error-code` sees as `insufficient-space`. An ENOSPC or
//! EDQUOT coming back from the real filesystem is noted on the job, so its
//! failure message can say the disk is full even when the guest's libc
//! reports every stream error as a bare EIO.

use std::sync::Arc;

use bytes::Bytes;
use wasmtime_wasi::p2::{OutputStream, Pollable, StreamError, StreamResult};

use super::budget::{Full, JobDisk};

/// A file output stream under a disk budget.
pub(crate) struct ChargedStream {
    inner: Box<dyn OutputStream>,
    disk: Arc<JobDisk>,
}

impl ChargedStream {
    pub(crate) fn new(inner: Box<dyn OutputStream>, disk: Arc<JobDisk>) -> Self {
        Self { inner, disk }
    }

    /// Charges `len` bytes or fails the operation with ENOSPC.
    fn charge(&self, len: usize) -> StreamResult<()> {
        if self.disk.charge(len as u64) {
            Ok(())
        } else {
            Err(no_space())
        }
    }

    /// Passes `result` on, noting a full filesystem.
    fn watch<T>(&self, result: StreamResult<T>) -> StreamResult<T> {
        if let Err(StreamError::LastOperationFailed(err)) = &result
            && err.downcast_ref::<std::io::Error>().is_some_and(is_no_space)
        {
            self.disk.refused(Full::Filesystem);
        }
        result
    }
}

/// The error a refused write fails with.
fn no_space() -> StreamError {
    StreamError::LastOperationFailed(std::io::Error::from_raw_os_error(libc::ENOSPC).into())
}

/// Whether `err` says the filesystem (or the user's quota) is full.
pub(crate) fn is_no_space(err: &std::io::Error) -> bool {
    matches!(err.raw_os_error(), Some(libc::ENOSPC | libc::EDQUOT))
}

#[async_trait::async_trait]
impl OutputStream for ChargedStream {
    fn write(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        let result = self.inner.write(bytes);
        self.watch(result)
    }

    fn write_zeroes(&mut self, nelem: usize) -> StreamResult<()> {
        self.charge(nelem)?;
        let result = self.inner.write_zeroes(nelem);
        self.watch(result)
    }

    async fn blocking_write_and_flush(&mut self, bytes: Bytes) -> StreamResult<()> {
        self.charge(bytes.len())?;
        let result = self.inner.blocking_write_and_flush(bytes).await;
        self.watch(result)
    }

    fn flush(&mut self) -> StreamResult<()> {
        let result = self.inner.flush();
        self.watch(result)
    }

    fn check_write(&mut self) -> StreamResult<usize> {
        let result = self.inner.check_write();
        self.watch(result)
    }

    async fn write_ready(&mut self) -> StreamResult<usize> {
        let result = self.inner.write_ready().await;
        self.watch(result)
    }

    async fn cancel(&mut self) {
        self.inner.cancel().await;
    }
}

#[async_trait::async_trait]
impl Pollable for ChargedStream {
    async fn ready(&mut self) {
        self.inner.ready().await;
    }
}
