//! `wasi:filesystem/types` under a disk budget: every method is
//! wasmtime-wasi's own, except that what grows the disk is charged first.
//!
//! - `write` charges its length, refunds what was not written, and fails
//!   with `insufficient-space` when the budget has no room;
//! - `write-via-stream` and `append-via-stream` wrap the stream they return
//!   in a [`ChargedStream`];
//! - `set-size` charges the growth;
//! - `open-at` with `create`, `create-directory-at`, `symlink-at` and
//!   `link-at` charge one entry ([`ENTRY_BYTES`]);
//! - `unlink-file-at`, `remove-directory-at`, `rename-at` and a truncating
//!   `open-at` or shrinking `set-size` mark the budget as possibly freed, so
//!   the next refused write measures the directories again at once.
//!
//! A job of a plugin without read-write directories has no budget and gets
//! wasmtime-wasi's methods unchanged.
//!
//! With tracing on and the job sampled, every `open-at` (the guest's file
//! opens, in any preopened directory) also gets a child span of the job
//! (`crate::otel::host`).

use std::sync::Arc;

use wasmtime::component::{HasData, Resource};
use wasmtime_wasi::filesystem::WasiFilesystemCtxView;
use wasmtime_wasi::p2::bindings::filesystem::types::{
    self, Descriptor, DirectoryEntryStream, ErrorCode, HostDescriptor, HostDirectoryEntryStream,
};
use wasmtime_wasi::p2::{DynInputStream, DynOutputStream, FsError, FsResult};

use super::budget::{ENTRY_BYTES, Full, JobDisk};
use super::stream::ChargedStream;
use crate::otel::{HostSpan, JobTrace};

/// [`HasData`] marker for linking [`BudgetedFs`].
pub(crate) struct Budgeted;

impl HasData for Budgeted {
    type Data<'a> = BudgetedFs<'a>;
}

/// wasmtime-wasi's filesystem view plus the job's disk budget.
pub struct BudgetedFs<'a> {
    /// wasmtime-wasi's filesystem context and the job's resource table.
    pub fs: WasiFilesystemCtxView<'a>,
    /// The job's share of its plugin's budget; `None` without rw dirs.
    pub disk: Option<&'a Arc<JobDisk>>,
    /// The job's trace while it is sampled: each `open-at` gets a span.
    pub(crate) trace: Option<&'a JobTrace>,
}

impl BudgetedFs<'_> {
    /// Charges `bytes`, or fails with `insufficient-space`.
    fn charge(&self, bytes: u64) -> FsResult<()> {
        match self.disk {
            Some(disk) if !disk.charge(bytes) => Err(ErrorCode::InsufficientSpace.into()),
            _ => Ok(()),
        }
    }

    fn refund(&self, bytes: u64) {
        if let Some(disk) = self.disk {
            disk.refund(bytes);
        }
    }

    fn freed(&self) {
        if let Some(disk) = self.disk {
            disk.freed();
        }
    }

    /// Passes `result` on, noting a full filesystem.
    fn watch<T>(&self, result: FsResult<T>) -> FsResult<T> {
        if let (Some(disk), Err(err)) = (self.disk, &result)
            && matches!(err.downcast_ref(), Some(ErrorCode::InsufficientSpace))
        {
            disk.refused(Full::Filesystem);
        }
        result
    }

    /// Charges one new directory entry, or fails with `insufficient-space`.
    fn charge_entry(&self) -> FsResult<()> {
        if self.disk.is_some() {
            self.charge(ENTRY_BYTES)
        } else {
            Ok(())
        }
    }

    /// Passes on the result of an entry-creating call charged with
    /// [`Self::charge_entry`], refunding the entry if it failed.
    fn entry_made<T>(&self, result: FsResult<T>) -> FsResult<T> {
        if result.is_err() {
            self.refund(ENTRY_BYTES);
        }
        self.watch(result)
    }

    /// Wraps a file output stream just created in the table.
    fn wrap(&mut self, stream: Resource<DynOutputStream>) -> FsResult<Resource<DynOutputStream>> {
        let Some(disk) = self.disk else {
            return Ok(stream);
        };
        let inner = self.fs.table.delete(stream).map_err(FsError::trap)?;
        let charged: DynOutputStream = Box::new(ChargedStream::new(inner, disk.clone()));
        self.fs.table.push(charged).map_err(FsError::trap)
    }
}

impl types::Host for BudgetedFs<'_> {
    fn convert_error_code(&mut self, err: FsError) -> wasmtime::Result<ErrorCode> {
        types::Host::convert_error_code(&mut self.fs, err)
    }

    fn filesystem_error_code(&mut self, err: Resource<wasmtime::Error>) -> wasmtime::Result<Option<ErrorCode>> {
        types::Host::filesystem_error_code(&mut self.fs, err)
    }
}

impl HostDescriptor for BudgetedFs<'_> {
    async fn advise(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
        len: types::Filesize,
        advice: types::Advice,
    ) -> FsResult<()> {
        self.fs.advise(fd, offset, len, advice).await
    }

    async fn sync_data(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        let result = self.fs.sync_data(fd).await;
        self.watch(result)
    }

    async fn get_flags(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorFlags> {
        self.fs.get_flags(fd).await
    }

    async fn get_type(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorType> {
        self.fs.get_type(fd).await
    }

    async fn set_size(&mut self, fd: Resource<Descriptor>, size: types::Filesize) -> FsResult<()> {
        if self.disk.is_none() {
            return self.fs.set_size(fd, size).await;
        }
        let current = self.fs.stat(Resource::new_borrow(fd.rep())).await?.size;
        let growth = size.saturating_sub(current);
        self.charge(growth)?;
        let result = self.fs.set_size(fd, size).await;
        if result.is_err() {
            self.refund(growth);
        } else if size < current {
            self.freed();
        }
        self.watch(result)
    }

    async fn set_times(
        &mut self,
        fd: Resource<Descriptor>,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.fs.set_times(fd, atim, mtim).await
    }

    async fn read(
        &mut self,
        fd: Resource<Descriptor>,
        len: types::Filesize,
        offset: types::Filesize,
    ) -> FsResult<(Vec<u8>, bool)> {
        self.fs.read(fd, len, offset).await
    }

    async fn write(
        &mut self,
        fd: Resource<Descriptor>,
        buf: Vec<u8>,
        offset: types::Filesize,
    ) -> FsResult<types::Filesize> {
        let len = buf.len() as u64;
        self.charge(len)?;
        let result = self.fs.write(fd, buf, offset).await;
        self.refund(len - result.as_ref().map_or(0, |written| (*written).min(len)));
        self.watch(result)
    }

    async fn read_directory(&mut self, fd: Resource<Descriptor>) -> FsResult<Resource<DirectoryEntryStream>> {
        self.fs.read_directory(fd).await
    }

    async fn sync(&mut self, fd: Resource<Descriptor>) -> FsResult<()> {
        let result = self.fs.sync(fd).await;
        self.watch(result)
    }

    async fn create_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        self.charge_entry()?;
        let result = self.fs.create_directory_at(fd, path).await;
        self.entry_made(result)
    }

    async fn stat(&mut self, fd: Resource<Descriptor>) -> FsResult<types::DescriptorStat> {
        self.fs.stat(fd).await
    }

    async fn stat_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::DescriptorStat> {
        self.fs.stat_at(fd, path_flags, path).await
    }

    async fn set_times_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        atim: types::NewTimestamp,
        mtim: types::NewTimestamp,
    ) -> FsResult<()> {
        self.fs.set_times_at(fd, path_flags, path, atim, mtim).await
    }

    async fn link_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path_flags: types::PathFlags,
        old_path: String,
        new_descriptor: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        self.charge_entry()?;
        let result = self
            .fs
            .link_at(fd, old_path_flags, old_path, new_descriptor, new_path)
            .await;
        self.entry_made(result)
    }

    async fn open_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
        oflags: types::OpenFlags,
        flags: types::DescriptorFlags,
    ) -> FsResult<Resource<Descriptor>> {
        let (create, truncate) = (
            oflags.contains(types::OpenFlags::CREATE),
            oflags.contains(types::OpenFlags::TRUNCATE),
        );
        let mut span = match self.trace {
            Some(trace) => trace.file_open(&path, create, truncate),
            None => HostSpan::default(),
        };
        if truncate {
            self.freed();
        }
        let result = match create {
            false => self.fs.open_at(fd, path_flags, path, oflags, flags).await,
            true => match self.charge_entry() {
                Ok(()) => {
                    let result = self.fs.open_at(fd, path_flags, path, oflags, flags).await;
                    self.entry_made(result)
                }
                Err(err) => Err(err),
            },
        };
        if let Err(err) = &result {
            match err.downcast_ref() {
                Some(code) => {
                    let code = format!("{code:?}");
                    span.failed(&code, &code);
                }
                None => span.failed("_OTHER", &format!("{err:?}")),
            }
        }
        result
    }

    fn drop(&mut self, fd: Resource<Descriptor>) -> wasmtime::Result<()> {
        HostDescriptor::drop(&mut self.fs, fd)
    }

    async fn readlink_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<String> {
        self.fs.readlink_at(fd, path).await
    }

    async fn remove_directory_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        let result = self.fs.remove_directory_at(fd, path).await;
        self.freed();
        result
    }

    async fn rename_at(
        &mut self,
        fd: Resource<Descriptor>,
        old_path: String,
        new_fd: Resource<Descriptor>,
        new_path: String,
    ) -> FsResult<()> {
        let result = self.fs.rename_at(fd, old_path, new_fd, new_path).await;
        self.freed();
        result
    }

    async fn symlink_at(&mut self, fd: Resource<Descriptor>, src_path: String, dest_path: String) -> FsResult<()> {
        self.charge_entry()?;
        let result = self.fs.symlink_at(fd, src_path, dest_path).await;
        self.entry_made(result)
    }

    async fn unlink_file_at(&mut self, fd: Resource<Descriptor>, path: String) -> FsResult<()> {
        let result = self.fs.unlink_file_at(fd, path).await;
        self.freed();
        result
    }

    fn read_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynInputStream>> {
        self.fs.read_via_stream(fd, offset)
    }

    fn write_via_stream(
        &mut self,
        fd: Resource<Descriptor>,
        offset: types::Filesize,
    ) -> FsResult<Resource<DynOutputStream>> {
        let stream = self.fs.write_via_stream(fd, offset)?;
        self.wrap(stream)
    }

    fn append_via_stream(&mut self, fd: Resource<Descriptor>) -> FsResult<Resource<DynOutputStream>> {
        let stream = self.fs.append_via_stream(fd)?;
        self.wrap(stream)
    }

    async fn is_same_object(&mut self, a: Resource<Descriptor>, b: Resource<Descriptor>) -> wasmtime::Result<bool> {
        self.fs.is_same_object(a, b).await
    }

    async fn metadata_hash(&mut self, fd: Resource<Descriptor>) -> FsResult<types::MetadataHashValue> {
        self.fs.metadata_hash(fd).await
    }

    async fn metadata_hash_at(
        &mut self,
        fd: Resource<Descriptor>,
        path_flags: types::PathFlags,
        path: String,
    ) -> FsResult<types::MetadataHashValue> {
        self.fs.metadata_hash_at(fd, path_flags, path).await
    }
}

impl HostDirectoryEntryStream for BudgetedFs<'_> {
    async fn read_directory_entry(
        &mut self,
        stream: Resource<DirectoryEntryStream>,
    ) -> FsResult<Option<types::DirectoryEntry>> {
        self.fs.read_directory_entry(stream).await
    }

    fn drop(&mut self, stream: Resource<DirectoryEntryStream>) -> wasmtime::Result<()> {
        HostDirectoryEntryStream::drop(&mut self.fs, stream)
    }
}
