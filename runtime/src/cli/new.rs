//! `wasmjobs new rust|python|js DIR`: a plugin directory ready to build.
//!
//! Writes the source (`Cargo.toml` and `src/lib.rs`, `app.py` or `job.js`)
//! and a `wasmjobs.toml` whose `component` is the file `wasmjobs build`
//! writes, with the grants and limits a plugin may declare shown as
//! comments. The templates are in `cli/templates/`, rendered with
//! minijinja; nothing is written over an existing file. Nothing written
//! names a path on this machine: a Rust plugin depends on the guest SDK
//! by version (this binary's), so the directory can be committed and
//! built elsewhere ([`super::sdk`]).

#[cfg(test)]
use std::path::Path;
use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result, bail};
use clap::{Args, ValueEnum};
use serde::Serialize;

use super::sdk::SDK_VERSION;

/// The language of a plugin.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Language {
    /// Rust, built with cargo for wasm32-wasip2.
    Rust,
    /// Python, built with componentize-py.
    Python,
    /// JavaScript, built with componentize-js.
    Js,
}

/// Arguments of `wasmjobs new`.
#[derive(Debug, Args)]
pub struct NewArgs {
    /// The plugin's language.
    pub language: Language,
    /// The directory to create (its name names the plugin).
    pub dir: PathBuf,
    /// The job class it serves (default: from the directory name, e.g.
    /// `greet` → `GreetJob`).
    #[arg(long)]
    pub class: Option<String>,
}

impl Language {
    /// The language's name, as a person writes it.
    pub fn name(self) -> &'static str {
        match self {
            Language::Rust => "Rust",
            Language::Python => "Python",
            Language::Js => "JavaScript",
        }
    }
}

#[derive(Serialize)]
#[cfg_attr(test, derive(Clone))]
struct Placeholders {
    class: String,
    crate_name: String,
    component: String,
    /// The guest SDK's version (this binary's), for a Rust plugin's
    /// `Cargo.toml`.
    sdk_version: &'static str,
    /// How to make `perform` async in this language, for the manifest's
    /// `concurrent` hint; empty where the SDK cannot build the async-plugin
    /// world (JavaScript: componentize-js 0.23 has no async exports).
    async_how: &'static str,
}

/// Runs the command.
pub fn run(args: &NewArgs) -> Result<ExitCode> {
    let name = args
        .dir
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty())
        .with_context(|| format!("{}: not a directory name", args.dir.display()))?;
    let class = match &args.class {
        Some(class) => class.clone(),
        None => class_name(name),
    };
    if !is_class_name(&class) {
        bail!("{class:?} is not a job class name: letters, digits and '_', starting with a letter (e.g. GreetJob)");
    }
    let crate_name = crate_name(name);
    let context = Placeholders {
        class: class.clone(),
        component: format!("{}.wasm", crate_name.replace('-', "_")),
        crate_name,
        sdk_version: SDK_VERSION,
        async_how: async_how(args.language),
    };
    let files: &[(&str, &str)] = match args.language {
        Language::Rust => &[
            ("Cargo.toml", include_str!("templates/Cargo.toml.j2")),
            ("src/lib.rs", include_str!("templates/lib.rs.j2")),
        ],
        Language::Python => &[("app.py", include_str!("templates/app.py.j2"))],
        Language::Js => &[("job.js", include_str!("templates/job.js.j2"))],
    };
    let manifest = ("wasmjobs.toml", include_str!("templates/wasmjobs.toml.j2"));
    let rendered = files
        .iter()
        .chain(std::iter::once(&manifest))
        .map(|(path, template)| Ok((*path, render(template, &context)?)))
        .collect::<Result<Vec<_>>>()?;

    for (path, _) in &rendered {
        let target = args.dir.join(path);
        if target.exists() {
            bail!(
                "{} already exists: wasmjobs new writes only new files",
                target.display()
            );
        }
    }
    for (path, text) in &rendered {
        let target = args.dir.join(path);
        if let Some(parent) = target.parent() {
            std::fs::create_dir_all(parent).with_context(|| format!("cannot create {}", parent.display()))?;
        }
        std::fs::write(&target, text).with_context(|| format!("cannot write {}", target.display()))?;
    }
    let dir = args.dir.display();
    println!("created {dir}: a {} plugin serving {class}", args.language.name());
    println!("next: wasmjobs build {dir}");
    Ok(ExitCode::SUCCESS)
}

/// How the manifest's `concurrent` hint tells a `language` plugin to make
/// its `perform` async (empty: its SDK cannot).
fn async_how(language: Language) -> &'static str {
    match language {
        Language::Python => {
            "make `perform` an `async def` that awaits http/sql calls;\n# `wasmjobs build` then builds it for the async world"
        }
        Language::Rust => {
            "implement `AsyncJob` (an `async fn perform` that awaits `http::get_async`\n# or `sql::query_async`) and export it with `export_async_job!`"
        }
        Language::Js => "",
    }
}

fn render(template: &str, context: &Placeholders) -> Result<String> {
    let mut env = minijinja::Environment::new();
    env.set_keep_trailing_newline(true);
    env.render_str(template, context)
        .context("cannot render a plugin template")
}

/// `greet-user` → `GreetUserJob`; a name already ending in `Job` keeps it.
fn class_name(dir_name: &str) -> String {
    let mut class: String = dir_name
        .split(|c: char| !c.is_ascii_alphanumeric())
        .filter(|part| !part.is_empty())
        .map(|part| {
            let mut chars = part.chars();
            chars
                .next()
                .map(|first| first.to_ascii_uppercase().to_string() + chars.as_str())
                .unwrap_or_default()
        })
        .collect();
    if class.is_empty() || !class.starts_with(|c: char| c.is_ascii_alphabetic()) {
        class.insert_str(0, "My");
    }
    if !class.ends_with("Job") {
        class.push_str("Job");
    }
    class
}

fn is_class_name(class: &str) -> bool {
    class.starts_with(|c: char| c.is_ascii_alphabetic())
        && class.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
        && class.len() <= 128
}

/// A Cargo package name from a directory name: lowercase ASCII letters,
/// digits, `-` and `_`, starting with a letter.
fn crate_name(dir_name: &str) -> String {
    let mut name: String = dir_name
        .chars()
        .map(|c| match c {
            'a'..='z' | '0'..='9' | '-' | '_' => c,
            'A'..='Z' => c.to_ascii_lowercase(),
            _ => '-',
        })
        .collect();
    if !name.starts_with(|c: char| c.is_ascii_lowercase()) {
        name.insert_str(0, "job-");
    }
    name
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn class_names_come_from_directory_names() {
        assert_eq!(class_name("greet"), "GreetJob");
        assert_eq!(class_name("send-email"), "SendEmailJob");
        assert_eq!(class_name("ReportJob"), "ReportJob");
        assert_eq!(class_name("42"), "My42Job");
        assert!(is_class_name("GreetJob"));
        assert!(!is_class_name("9Job"));
        assert!(!is_class_name("Greet Job"));
    }

    #[test]
    fn crate_names_are_valid_package_names() {
        assert_eq!(crate_name("Greet User"), "greet-user");
        assert_eq!(crate_name("py_greet"), "py_greet");
        assert_eq!(crate_name("1st"), "job-1st");
    }

    #[test]
    fn templates_render_every_placeholder() {
        let context = Placeholders {
            class: "GreetJob".into(),
            crate_name: "greet".into(),
            component: "greet.wasm".into(),
            sdk_version: "0.1.0",
            async_how: "",
        };
        for template in [
            include_str!("templates/Cargo.toml.j2"),
            include_str!("templates/lib.rs.j2"),
            include_str!("templates/app.py.j2"),
            include_str!("templates/job.js.j2"),
            include_str!("templates/wasmjobs.toml.j2"),
        ] {
            let text = render(template, &context).unwrap();
            assert!(!text.contains("{{"), "{text}");
            assert!(text.ends_with('\n'));
        }
        let manifest = render(include_str!("templates/wasmjobs.toml.j2"), &context).unwrap();
        let parsed = crate::plugin::Manifest::parse(Path::new("/p/greet/wasmjobs.toml"), &manifest).unwrap();
        assert_eq!(parsed.component, Path::new("/p/greet/greet.wasm"));
        assert_eq!(parsed.classes, ["GreetJob"]);
        assert_eq!(
            parsed.examples.get("GreetJob").map(String::as_str),
            Some(r#"["world"]"#)
        );
        assert!(!manifest.contains("concurrent = 100"), "{manifest}");
        // Every grant and limit a manifest may set is shown, as the header says.
        for key in [
            "env = ",
            "sql = ",
            "[http]",
            "30 s",
            "[[files]]",
            "memory = ",
            "timeout = ",
            "fuel = ",
            "disk = ",
            "concurrency = ",
            "log = ",
            "rate = ",
            "[limits.per_key]",
            "key = ",
            "[[schedule]]",
            "cron = ",
            "[instances]",
            "reuse = ",
        ] {
            assert!(manifest.contains(key), "the template does not show {key}:\n{manifest}");
        }
        // Python's and Rust's manifests suggest `concurrent`, each saying
        // how, and still parse.
        for (language, how) in [(Language::Python, "`async def`"), (Language::Rust, "export_async_job!")] {
            let with_hint = Placeholders {
                async_how: async_how(language),
                ..context.clone()
            };
            let manifest = render(include_str!("templates/wasmjobs.toml.j2"), &with_hint).unwrap();
            assert!(manifest.contains("# concurrent = 100"), "{manifest}");
            assert!(manifest.contains(how), "{manifest}");
            assert!(!manifest.contains("{%"), "{manifest}");
            crate::plugin::Manifest::parse(Path::new("/p/greet/wasmjobs.toml"), &manifest).unwrap();
        }
        assert_eq!(async_how(Language::Js), "");
    }
}
