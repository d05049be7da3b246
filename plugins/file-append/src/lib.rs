//! `FileAppendJob`: a file-I/O job, appending one line to a file in the
//! plugin's data directory (the benchmarks' `File.open(name, "a")` job).

use std::fs::OpenOptions;
use std::io::Write;

use wasmjobs_guest::serde_json::Value;
use wasmjobs_guest::{Job, JobError, JobInfo, export_job};

/// Where the manifest mounts the plugin's data directory.
const DATA_DIR: &str = "/data";

/// `FileAppendJob.perform_async(file_name, id)`: appends `"{id}\n"` to
/// `/data/{file_name}`, creating the file if needed. `id` may be a JSON number
/// or string.
pub struct FileAppendJob;

impl Job for FileAppendJob {
    type Args = (String, Value);

    fn perform(_job: &JobInfo, (file_name, id): Self::Args) -> Result<(), JobError> {
        check_file_name(&file_name)?;
        let line = format!("{}\n", id_text(&id)?);
        let mut file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(format!("{DATA_DIR}/{file_name}"))?;
        // One write per line: with O_APPEND, concurrent jobs' lines never
        // interleave.
        file.write_all(line.as_bytes())?;
        Ok(())
    }
}

/// Only plain names inside the data directory. The host's sandbox already
/// confines the guest to its preopens; this is defence in depth and a clear
/// message for a job that can never succeed.
fn check_file_name(file_name: &str) -> Result<(), JobError> {
    if file_name.is_empty()
        || file_name.contains('/')
        || file_name.contains('\\')
        || file_name.contains("..")
        || file_name.contains('\0')
    {
        return Err(JobError::dead(format!(
            "invalid file name {file_name:?}: expected a plain file name (no '/', '..')"
        )));
    }
    Ok(())
}

/// The id as text: numbers as JSON prints them, strings as is.
fn id_text(id: &Value) -> Result<String, JobError> {
    match id {
        Value::Number(number) => Ok(number.to_string()),
        Value::String(text) => Ok(text.clone()),
        other => Err(JobError::dead(format!(
            "invalid id {other}: expected a number or a string"
        ))),
    }
}

export_job!(FileAppendJob);

#[cfg(test)]
mod tests {
    use super::*;
    use wasmjobs_guest::serde_json::json;

    #[test]
    fn ids() {
        assert_eq!(id_text(&json!(42)).unwrap(), "42");
        assert_eq!(id_text(&json!("abc")).unwrap(), "abc");
        assert_eq!(id_text(&json!(-1.5)).unwrap(), "-1.5");
        assert!(id_text(&json!(null)).is_err());
    }

    #[test]
    fn file_names() {
        assert!(check_file_name("out.txt").is_ok());
        for bad in ["", "a/b", "../x", "..", "/etc/passwd", "a\\b"] {
            let error = check_file_name(bad).unwrap_err();
            assert_eq!(error.kind(), wasmjobs_guest::JobErrorKind::Dead, "{bad}");
        }
    }
}
