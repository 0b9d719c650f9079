//! wasmtime's argument habit for `pier run` and `pier boot`: what follows
//! the component (or image) is the app's, so `pier run echo.wasm --port
//! 1234` passes `--port 1234` to echo, as `wasmtime run` would.
//!
//! clap only knows the `--` form (`pier run echo.wasm -- --port 1234`),
//! which keeps working. So before clap parses, [`rewrite`] finds the
//! component and puts a `--` before the app's first argument. pier's own
//! options may still follow the component, as they always could (`pier run
//! echo.wasm --listen 1234 -- --port 1234`): the app's arguments start at
//! the first argument after the component that is not one of pier's
//! options. An app option with the same name as one of pier's (`--cid`)
//! therefore needs the `--` form. Which options pier has, and which of
//! them take a value, comes from clap's own definition of the command, so
//! the two never disagree.

use std::ffi::OsString;

use clap::Command;

/// The subcommands whose first positional argument is an app, followed by
/// the app's arguments.
const APP_COMMANDS: [&str; 2] = ["run", "boot"];

/// One of pier's options for a subcommand: its spellings, and whether a
/// value follows it as the next argument.
struct Known {
    spellings: Vec<String>,
    takes_value: bool,
}

fn known_options(command: &Command) -> Vec<Known> {
    command
        .get_arguments()
        .filter(|a| !a.is_positional())
        .map(|a| {
            let mut spellings: Vec<String> = Vec::new();
            if let Some(long) = a.get_long() {
                spellings.push(format!("--{long}"));
            }
            for alias in a.get_all_aliases().into_iter().flatten() {
                spellings.push(format!("--{alias}"));
            }
            if let Some(short) = a.get_short() {
                spellings.push(format!("-{short}"));
            }
            Known { spellings, takes_value: a.get_action().takes_values() }
        })
        .collect()
}

/// How a token after the subcommand reads: `None` if it is not one of
/// pier's options; otherwise whether the next token is its value.
fn pier_option(known: &[Known], token: &str) -> Option<bool> {
    let (name, inline_value) = match token.split_once('=') {
        Some((name, _)) => (name, true),
        None => (token, false),
    };
    let option = known.iter().find(|k| k.spellings.iter().any(|s| s == name))?;
    Some(option.takes_value && !inline_value)
}

/// Returns `args` (the whole command line, program name first) with a `--`
/// inserted before the app's first argument, where the subcommand is one
/// that runs an app and the command line has no `--` of its own.
pub fn rewrite(cli: &Command, args: Vec<OsString>) -> Vec<OsString> {
    let Some(at) = args.iter().skip(1).position(|a| !a.to_string_lossy().starts_with('-')) else {
        return args;
    };
    let sub_at = at + 1;
    let sub_name = args[sub_at].to_string_lossy().into_owned();
    if !APP_COMMANDS.contains(&sub_name.as_str()) {
        return args;
    }
    let Some(sub) = cli.find_subcommand(&sub_name) else {
        return args;
    };
    // Global options (-v, -q) live on the parent command.
    let mut known = known_options(sub);
    known.extend(known_options(cli));
    let mut app_seen = false;
    let mut i = sub_at + 1;
    while i < args.len() {
        let token = args[i].to_string_lossy();
        if token == "--" {
            return args;
        }
        match pier_option(&known, &token) {
            Some(takes_value) => i += if takes_value { 2 } else { 1 },
            None if !app_seen => {
                app_seen = true;
                i += 1;
            }
            None => {
                let mut out = args;
                out.insert(i, OsString::from("--"));
                return out;
            }
        }
    }
    args
}
