//! `cargo xtask module-cycles`: no module imports one that imports it back.
//!
//! A cycle between modules means neither can be read, tested or moved
//! without the other: they are one module split across files. This finds
//! them in every crate of the repository, so CI fails when one appears.
//!
//! # What it reads
//!
//! Every package under the scanned folder (a folder with a `Cargo.toml`
//! holding `[package]`, outside `target/` and hidden folders): the root
//! workspace's crates, `guest-apps/*`, `guest-linux/*`,
//! `host/containerd-shim` and `fuzz`. Each crate root of a package's
//! `src/` (`lib.rs`, `main.rs`, `bin/*.rs`, `bin/*/main.rs`) is its own
//! graph, and its modules are the files its `mod x;` declarations reach
//! (`#[path]` included), whatever their `cfg`. `tests/`, `benches/` and
//! `examples/` files are crates of their own and are not read; neither are
//! `[[bin]]` targets outside `src/` (the fuzz targets, one file each).
//!
//! # The graph
//!
//! A node is a module file. An inline `mod x { .. }` (a `#[cfg(test)] mod
//! tests`, say) belongs to the file it is written in: its paths resolve
//! from where it stands (its `super` is the file's module), but its edges
//! are the file's, so the tests' `use super::*` ties a file to itself,
//! which is no edge.
//!
//! An edge A -> B means code in A names an item that module B defines:
//!
//! - a `use` of an item (`use crate::b::Thing`, `use super::b::thing`,
//!   `use self::b::Thing`, or a path starting at a child module or at a
//!   name A imported), anywhere in A, a function's body included;
//! - a path in code (`crate::b::Thing`, `super::b::thing()`,
//!   `b::thing()` for a child module `b`, `alias::f()` for a module A
//!   imported as `alias`); a `$crate::` path in the body of a macro A
//!   defines is not A's: it is resolved where the macro expands, so it
//!   ties the expanding code, not A, to the item;
//! - a glob `use b::*`: an edge to the module defining each name the glob
//!   brings in that A's code mentions (a glob of an enum's variants: an
//!   edge to the enum's module).
//!
//! Comments, doc comments (intra-doc links too) and string literals are not
//! code. A path names the module that *defines* the item, not the one it
//! goes through: `crate::Thing`, when the crate root re-exports `Thing`
//! with `pub use b::Thing` (or a `pub use b::*`), is an edge to `b`, so a
//! root that re-exports its children is not in a cycle with the children
//! that use each other through it. For the same reason a `pub use` is no
//! edge from the module that writes it (it passes the name on) unless that
//! module's own code uses the name; nor is `mod child;`, nor importing a
//! module itself (`use crate::b;`): the paths through it are the edges.
//!
//! An item is a module-level `fn`, `struct`, `enum`, `union`, `trait`,
//! `type`, `const`, `static` or `macro_rules!` (a `#[macro_export]` macro
//! is named at the crate root and defined where it is written). A name a
//! module neither defines nor imports (made by a macro, declared in an
//! `extern` block) counts as defined where the path stops.
//!
//! The scan is of tokens, not a full parse: it knows Rust's comments,
//! strings, raw strings, characters and lifetimes, and it resolves names
//! through `mod`, `use`, globs and re-exports, which is all a module path
//! needs. It over-approximates in one place: a glob edge is drawn when A
//! mentions a name the glob brings in, even if that mention is a local
//! variable or a field of the same name.
//!
//! # Reporting
//!
//! For each crate, each cycle is printed with the names that tie every
//! step (file and line): the shortest cycle through each edge that has
//! one, so every edge that needs breaking is shown once.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fmt;
use std::path::{Component, Path, PathBuf};

/// What a scan of a repository found.
#[derive(Debug)]
pub struct Report {
    /// The crate roots read, relative to the scanned folder.
    pub roots: Vec<String>,
    /// Module files read.
    pub files: usize,
    /// Edges between distinct module files, over all crates.
    pub edges: usize,
    /// Every cycle, crate by crate.
    pub cycles: Vec<Cycle>,
    /// `.rs` files under a `src/` that no crate root reaches (not compiled,
    /// or reached only from outside `src/`), relative to the scanned folder.
    pub unreached: Vec<String>,
    /// `mod x;` declarations with no file, as `file:line: mod x`.
    pub missing: Vec<String>,
}

/// One cycle of module imports.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Cycle {
    /// The package folder, relative to the scanned folder (`host/device`).
    pub package: String,
    /// The crate root, relative to the package (`src/lib.rs`).
    pub root: String,
    /// The steps, each from the previous step's `to`; the last ends where
    /// the first starts.
    pub hops: Vec<Hop>,
}

/// One edge of a cycle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hop {
    /// The importing file, relative to the package.
    pub from: String,
    /// The imported file, relative to the package.
    pub to: String,
    /// What ties them: each path or `use` in `from` naming an item of
    /// `to`, with its lines (`use crate::wire::Header (line 12)`).
    pub names: Vec<String>,
}

impl Cycle {
    /// The files of the cycle, in order, starting with the least.
    pub fn files(&self) -> Vec<&str> {
        self.hops.iter().map(|h| h.from.as_str()).collect()
    }
}

/// How many names a hop lists before it says how many more there are.
const NAMES_SHOWN: usize = 4;

impl fmt::Display for Cycle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut files = self.files();
        files.push(files[0]);
        writeln!(f, "  cycle: {}", files.join(" -> "))?;
        for hop in &self.hops {
            let shown = &hop.names[..hop.names.len().min(NAMES_SHOWN)];
            write!(f, "    {} -> {}: {}", hop.from, hop.to, shown.join("; "))?;
            if hop.names.len() > NAMES_SHOWN {
                write!(f, "; and {} more", hop.names.len() - NAMES_SHOWN)?;
            }
            writeln!(f)?;
        }
        Ok(())
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut crate_root = None;
        for cycle in &self.cycles {
            if crate_root != Some((&cycle.package, &cycle.root)) {
                let n = self
                    .cycles
                    .iter()
                    .filter(|c| c.package == cycle.package && c.root == cycle.root)
                    .count();
                writeln!(f, "{}/{}: {n} cycle{}", cycle.package, cycle.root, plural(n))?;
                crate_root = Some((&cycle.package, &cycle.root));
            }
            write!(f, "{cycle}")?;
        }
        for file in &self.unreached {
            writeln!(f, "note: {file} is reached by no crate root's `mod` declarations")?;
        }
        for declaration in &self.missing {
            writeln!(f, "note: {declaration}: no such module file")?;
        }
        write!(
            f,
            "module-cycles: {} crates, {} files, {} edges: {} cycle{}",
            self.roots.len(),
            self.files,
            self.edges,
            self.cycles.len(),
            plural(self.cycles.len())
        )
    }
}

fn plural(n: usize) -> &'static str {
    if n == 1 { "" } else { "s" }
}

/// Scans every package under `root` (see the module documentation).
pub fn scan(root: &Path) -> Result<Report, String> {
    let mut packages = Vec::new();
    find_packages(root, &mut packages)?;
    packages.sort();
    let mut report = Report {
        roots: Vec::new(),
        files: 0,
        edges: 0,
        cycles: Vec::new(),
        unreached: Vec::new(),
        missing: Vec::new(),
    };
    for package in packages {
        let label = relative(root, &package);
        let src = package.join("src");
        let mut reached = HashSet::new();
        for crate_root in crate_roots(&src)? {
            let graph = CrateGraph::load(&package, &label, &crate_root, &mut report.missing)?;
            report.roots.push(relative(root, &crate_root));
            report.files += graph.files.len();
            let edges = graph.edges();
            report.edges += edges.len();
            report.cycles.extend(cycles(&graph.files, &edges).into_iter().map(|hops| Cycle {
                package: label.clone(),
                root: relative(&package, &crate_root),
                hops,
            }));
            reached.extend(graph.files.iter().map(|f| package.join(f)));
        }
        let mut all = Vec::new();
        rust_files(&src, &mut all)?;
        let mut unreached: Vec<String> =
            all.iter().filter(|f| !reached.contains(*f)).map(|f| relative(root, f)).collect();
        unreached.sort();
        report.unreached.extend(unreached);
    }
    Ok(report)
}

/// `path` relative to `base`, with `/` separators (and `..` where `path`
/// is outside `base`, as a `#[path]` may lead).
fn relative(base: &Path, path: &Path) -> String {
    let (base, path) = (normalize(base), normalize(path));
    let common = base.components().zip(path.components()).take_while(|(a, b)| a == b).count();
    let up = base.components().count() - common;
    let down = path.components().skip(common).map(|c| c.as_os_str().to_string_lossy());
    let parts: Vec<String> =
        std::iter::repeat_n("..".to_owned(), up).chain(down.map(|c| c.into_owned())).collect();
    if parts.is_empty() { ".".to_owned() } else { parts.join("/") }
}

/// `path` with its `.` and `..` folded away where they can be.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::CurDir => {}
            Component::ParentDir
                if matches!(out.components().next_back(), Some(Component::Normal(_))) =>
            {
                out.pop();
            }
            other => out.push(other),
        }
    }
    out
}

fn read_dir(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("reading {}: {e}", dir.display()))?;
    let mut paths = Vec::new();
    for entry in entries {
        paths.push(entry.map_err(|e| format!("reading {}: {e}", dir.display()))?.path());
    }
    paths.sort();
    Ok(paths)
}

/// The package folders at and under `dir`.
fn find_packages(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    let manifest = dir.join("Cargo.toml");
    if manifest.is_file() {
        let text = std::fs::read_to_string(&manifest)
            .map_err(|e| format!("reading {}: {e}", manifest.display()))?;
        if text.lines().any(|l| l.trim() == "[package]") {
            out.push(dir.to_path_buf());
        }
    }
    for path in read_dir(dir)? {
        let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        if path.is_dir() && !name.starts_with('.') && name != "target" && name != "src" {
            find_packages(&path, out)?;
        }
    }
    Ok(())
}

/// The crate roots cargo finds in a `src/` folder by itself.
fn crate_roots(src: &Path) -> Result<Vec<PathBuf>, String> {
    let mut roots: Vec<PathBuf> =
        ["lib.rs", "main.rs"].iter().map(|f| src.join(f)).filter(|p| p.is_file()).collect();
    let bin = src.join("bin");
    if bin.is_dir() {
        for path in read_dir(&bin)? {
            if path.extension().is_some_and(|e| e == "rs") {
                roots.push(path);
            } else if path.join("main.rs").is_file() {
                roots.push(path.join("main.rs"));
            }
        }
    }
    Ok(roots)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) -> Result<(), String> {
    if !dir.is_dir() {
        return Ok(());
    }
    for path in read_dir(dir)? {
        if path.is_dir() {
            rust_files(&path, out)?;
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    Ok(())
}

// ---- Tokens -------------------------------------------------------------

#[derive(Debug, Clone, PartialEq)]
enum Tok {
    Ident(String),
    /// `::`
    PathSep,
    Punct(char),
    /// A string literal's text, escapes left as written.
    Str(String),
    /// A number, character or lifetime: nothing a path is made of.
    Other,
}

#[derive(Debug)]
struct Token {
    tok: Tok,
    line: u32,
}

/// Splits Rust source into tokens, dropping whitespace and comments.
struct Lexer {
    chars: Vec<char>,
    at: usize,
    line: u32,
    tokens: Vec<Token>,
}

fn is_ident_start(c: char) -> bool {
    c.is_alphabetic() || c == '_'
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

fn lex(source: &str) -> Vec<Token> {
    let mut lexer = Lexer { chars: source.chars().collect(), at: 0, line: 1, tokens: Vec::new() };
    lexer.run();
    lexer.tokens
}

impl Lexer {
    fn peek(&self, ahead: usize) -> char {
        self.chars.get(self.at + ahead).copied().unwrap_or('\0')
    }

    /// Moves to `to`, counting the lines passed.
    fn advance_to(&mut self, to: usize) {
        let to = to.min(self.chars.len());
        self.line += self.chars[self.at..to].iter().filter(|&&c| c == '\n').count() as u32;
        self.at = to;
    }

    fn find_from(&self, from: usize, pred: impl Fn(char) -> bool) -> usize {
        (from..self.chars.len()).find(|&i| pred(self.chars[i])).unwrap_or(self.chars.len())
    }

    fn emit(&mut self, tok: Tok, line: u32) {
        self.tokens.push(Token { tok, line });
    }

    fn run(&mut self) {
        while self.at < self.chars.len() {
            let line = self.line;
            let c = self.peek(0);
            match c {
                c if c.is_whitespace() => self.advance_to(self.at + 1),
                '/' if self.peek(1) == '/' => {
                    let end = self.find_from(self.at, |c| c == '\n');
                    self.advance_to(end);
                }
                '/' if self.peek(1) == '*' => self.block_comment(),
                '"' => {
                    let text = self.string(self.at + 1);
                    self.emit(Tok::Str(text), line);
                }
                '\'' => {
                    self.quote();
                    self.emit(Tok::Other, line);
                }
                '$' => {
                    // A metavariable, `$crate` included: it only appears
                    // in macro bodies, which name items for the code they
                    // expand into (see the module documentation), so it
                    // starts no path of this file's.
                    let end = self.find_from(self.at + 1, |c| !is_ident_char(c));
                    self.advance_to(end.max(self.at + 1));
                    self.emit(Tok::Other, line);
                }
                ':' if self.peek(1) == ':' => {
                    self.advance_to(self.at + 2);
                    self.emit(Tok::PathSep, line);
                }
                c if c.is_ascii_digit() => {
                    let mut end = self.at;
                    while end < self.chars.len() {
                        let c = self.chars[end];
                        let fraction =
                            c == '.' && self.chars.get(end + 1).is_some_and(|d| d.is_ascii_digit());
                        if !(is_ident_char(c) || fraction) {
                            break;
                        }
                        end += 1;
                    }
                    self.advance_to(end);
                    self.emit(Tok::Other, line);
                }
                c if is_ident_start(c) => self.word(line),
                c => {
                    self.advance_to(self.at + 1);
                    self.emit(Tok::Punct(c), line);
                }
            }
        }
    }

    fn block_comment(&mut self) {
        let mut depth = 0usize;
        let mut i = self.at;
        while i < self.chars.len() {
            if self.chars[i] == '/' && self.chars.get(i + 1) == Some(&'*') {
                depth += 1;
                i += 2;
            } else if self.chars[i] == '*' && self.chars.get(i + 1) == Some(&'/') {
                depth -= 1;
                i += 2;
                if depth == 0 {
                    break;
                }
            } else {
                i += 1;
            }
        }
        self.advance_to(i);
    }

    /// A quoted string whose text starts at `body`; moves past its end.
    fn string(&mut self, body: usize) -> String {
        let mut i = body;
        while i < self.chars.len() && self.chars[i] != '"' {
            i += if self.chars[i] == '\\' { 2 } else { 1 };
        }
        let end = i.min(self.chars.len());
        let text = self.chars[body..end].iter().collect();
        self.advance_to(end + 1);
        text
    }

    /// A raw string whose `r` is at `r`, if there is one there; moves
    /// past its end.
    fn raw_string(&mut self, r: usize) -> Option<String> {
        let hashes = (r + 1..self.chars.len()).take_while(|&i| self.chars[i] == '#').count();
        let body = r + 1 + hashes + 1;
        if self.chars.get(body - 1) != Some(&'"') {
            return None;
        }
        let closes = |i: usize| {
            self.chars[i] == '"'
                && (1..=hashes).all(|h| self.chars.get(i + h).is_some_and(|&c| c == '#'))
        };
        let end = (body..self.chars.len()).find(|&i| closes(i)).unwrap_or(self.chars.len());
        let text = self.chars[body..end].iter().collect();
        self.advance_to(end + 1 + hashes);
        Some(text)
    }

    /// A character literal or a lifetime, at a `'`.
    fn quote(&mut self) {
        if self.peek(1) == '\\' {
            let end = self.find_from(self.at + 3, |c| c == '\'');
            self.advance_to(end + 1);
        } else if self.peek(2) == '\'' {
            self.advance_to(self.at + 3);
        } else {
            let end = self.find_from(self.at + 1, |c| !is_ident_char(c));
            self.advance_to(end);
        }
    }

    /// An identifier or keyword, or a literal with a letter prefix
    /// (`b"..."`, `r#"..."#`, `b'x'`, `c"..."`), or a raw identifier.
    fn word(&mut self, line: u32) {
        let (c, next) = (self.peek(0), self.peek(1));
        if matches!(c, 'b' | 'c') && next == '"' {
            let text = self.string(self.at + 2);
            return self.emit(Tok::Str(text), line);
        }
        if c == 'b' && next == '\'' {
            self.advance_to(self.at + 1);
            self.quote();
            return self.emit(Tok::Other, line);
        }
        let raw_at = match (c, next) {
            ('r', _) => Some(self.at),
            ('b' | 'c', 'r') => Some(self.at + 1),
            _ => None,
        };
        if let Some(text) = raw_at.and_then(|r| self.raw_string(r)) {
            return self.emit(Tok::Str(text), line);
        }
        let start = if c == 'r' && next == '#' && is_ident_start(self.peek(2)) {
            self.at + 2
        } else {
            self.at
        };
        let end = self.find_from(start, |c| !is_ident_char(c));
        let word = self.chars[start..end].iter().collect();
        self.advance_to(end);
        self.emit(Tok::Ident(word), line);
    }
}

// ---- Modules ------------------------------------------------------------

type ModId = usize;

/// One leaf of a `use` tree: `use a::{b::C as D}` has the leaf `a::b::C`
/// bound to `D`.
#[derive(Debug)]
struct UseLeaf {
    path: Vec<String>,
    /// The name it binds: `None` for a glob and for `as _`.
    bind: Option<String>,
    glob: bool,
    public: bool,
    /// At the module's top level, not in a function's body: a name other
    /// modules can reach through the module.
    module_level: bool,
    line: u32,
}

#[derive(Debug)]
struct PathRef {
    segments: Vec<String>,
    line: u32,
}

#[derive(Debug)]
struct Module {
    parent: Option<ModId>,
    /// The index of its file in [`CrateGraph::files`].
    file: usize,
    /// Where the files of its `mod x;` children are.
    child_dir: PathBuf,
    children: HashMap<String, ModId>,
    /// The items it names, each with the module defining it (a
    /// `#[macro_export]` macro is named at the root, defined elsewhere).
    items: HashMap<String, Vec<ModId>>,
    uses: Vec<UseLeaf>,
    paths: Vec<PathRef>,
    /// The names its code mentions outside `use` declarations, for the
    /// `pub use` and glob rules.
    mentions: HashSet<String>,
}

impl Module {
    fn new(parent: Option<ModId>, file: usize, child_dir: PathBuf) -> Module {
        Module {
            parent,
            file,
            child_dir,
            children: HashMap::new(),
            items: HashMap::new(),
            uses: Vec::new(),
            paths: Vec::new(),
            mentions: HashSet::new(),
        }
    }
}

/// What a path names: a module, or an item defined in a module.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Def {
    Module(ModId),
    Item(ModId),
}

impl Def {
    fn module(self) -> ModId {
        match self {
            Def::Module(m) | Def::Item(m) => m,
        }
    }
}

/// How many re-exports a name is followed through: far more than any real
/// chain, a bound for pathological globs.
const MAX_DEPTH: usize = 32;

const ITEM_KEYWORDS: &[&str] =
    &["fn", "struct", "enum", "union", "trait", "type", "const", "static"];

/// One crate's modules, module 0 its root.
#[derive(Debug)]
struct CrateGraph {
    modules: Vec<Module>,
    /// Its module files, relative to the package.
    files: Vec<String>,
}

/// The edges between a crate's files: for each (from, to), each path or
/// `use` that ties them with the lines it is on.
type Edges = BTreeMap<(usize, usize), BTreeMap<String, BTreeSet<u32>>>;

impl CrateGraph {
    /// Reads the crate whose root file is `root`, following its `mod`
    /// declarations; a declaration with no file goes to `missing`.
    fn load(
        package: &Path,
        label: &str,
        root: &Path,
        missing: &mut Vec<String>,
    ) -> Result<Self, String> {
        let dir = root.parent().unwrap_or(package).to_path_buf();
        let mut graph = CrateGraph {
            modules: vec![Module::new(None, 0, dir)],
            files: vec![relative(package, root)],
        };
        let mut queue = vec![(0, root.to_path_buf())];
        while let Some((module, path)) = queue.pop() {
            let source = std::fs::read_to_string(&path)
                .map_err(|e| format!("reading {}: {e}", path.display()))?;
            let tokens = lex(&source);
            let file_dir = path.parent().unwrap_or(package).to_path_buf();
            let mut parser = FileParser { graph: &mut graph, tokens: &tokens, file_dir };
            for declared in parser.parse(module) {
                let found = declared.candidates.iter().find(|p| p.is_file());
                let file_label = &graph.files[graph.modules[module].file];
                let Some(found) = found else {
                    missing.push(format!(
                        "{label}/{file_label}:{}: mod {}",
                        declared.line, declared.name
                    ));
                    continue;
                };
                let child_dir = if declared.path_attr || found.ends_with("mod.rs") {
                    found.parent().unwrap_or(package).to_path_buf()
                } else {
                    found.with_extension("")
                };
                let file = graph.files.len();
                graph.files.push(relative(package, found));
                let child = graph.add_module(declared.parent, &declared.name, file, child_dir);
                queue.push((child, found.clone()));
            }
        }
        Ok(graph)
    }

    fn add_module(&mut self, parent: ModId, name: &str, file: usize, child_dir: PathBuf) -> ModId {
        let id = self.modules.len();
        self.modules.push(Module::new(Some(parent), file, child_dir));
        self.modules[parent].children.insert(name.to_owned(), id);
        id
    }

    /// What `segments` name, seen from module `from`. `local` also looks
    /// at the names `from`'s function bodies import (for its own code).
    fn resolve(&self, from: ModId, segments: &[String], local: bool, depth: usize) -> Vec<Def> {
        let Some((first, rest)) = segments.split_first() else { return Vec::new() };
        let start = match first.as_str() {
            "crate" => vec![Def::Module(0)],
            "super" => self.modules[from].parent.map(Def::Module).into_iter().collect(),
            "self" => vec![Def::Module(from)],
            name => self.lookup(from, name, local, depth),
        };
        let mut defs = start;
        for segment in rest {
            let mut next = Vec::new();
            for def in defs {
                let Def::Module(module) = def else {
                    // An associated item or a variant: the item's module.
                    next.push(def);
                    continue;
                };
                match segment.as_str() {
                    "super" => next.extend(self.modules[module].parent.map(Def::Module)),
                    "self" => next.push(def),
                    name => {
                        let found = self.lookup(module, name, false, depth);
                        if found.is_empty() {
                            next.push(Def::Item(module));
                        }
                        next.extend(found);
                    }
                }
            }
            dedup(&mut next);
            defs = next;
        }
        defs
    }

    /// What `name` is in module `module`: a child, an item it defines, or
    /// what it imports under that name, directly or through a glob.
    fn lookup(&self, module: ModId, name: &str, local: bool, depth: usize) -> Vec<Def> {
        if depth > MAX_DEPTH {
            return Vec::new();
        }
        let m = &self.modules[module];
        let mut found: Vec<Def> =
            m.children.get(name).map(|&c| Def::Module(c)).into_iter().collect();
        found.extend(m.items.get(name).into_iter().flatten().map(|&d| Def::Item(d)));
        for leaf in &m.uses {
            // `use name;` imports an outside crate's `name`, never itself.
            let outside = leaf.path.len() == 1;
            if (leaf.module_level || local) && leaf.bind.as_deref() == Some(name) && !outside {
                found.extend(self.resolve(module, &leaf.path, false, depth + 1));
            }
        }
        if found.is_empty() {
            for leaf in m.uses.iter().filter(|l| l.glob && (l.module_level || local)) {
                for def in self.resolve(module, &leaf.path, false, depth + 1) {
                    if let Def::Module(q) = def
                        && q != module
                    {
                        found.extend(self.lookup(q, name, false, depth + 1));
                    }
                }
            }
        }
        dedup(&mut found);
        found
    }

    /// Every edge between two distinct files, with what ties it.
    fn edges(&self) -> Edges {
        let mut edges = Edges::new();
        for (id, module) in self.modules.iter().enumerate() {
            let mut add = |def: Def, line: u32, what: String| {
                let to = self.modules[def.module()].file;
                if to != module.file {
                    edges
                        .entry((module.file, to))
                        .or_default()
                        .entry(what)
                        .or_default()
                        .insert(line);
                }
            };
            for leaf in module.uses.iter().filter(|l| l.path.first().is_some_and(|s| s != "::")) {
                let path = leaf.path.join("::");
                let targets = self.resolve(id, &leaf.path, true, 0);
                if leaf.glob {
                    let mut mentions: Vec<&String> = module
                        .mentions
                        .iter()
                        .filter(|n| {
                            !module.items.contains_key(*n) && !module.children.contains_key(*n)
                        })
                        .collect();
                    mentions.sort();
                    for target in targets {
                        match target {
                            Def::Item(_) => add(target, leaf.line, format!("use {path}::*")),
                            Def::Module(q) => {
                                for name in &mentions {
                                    for def in self.lookup(q, name, false, 0) {
                                        add(def, leaf.line, format!("use {path}::* ({name})"));
                                    }
                                }
                            }
                        }
                    }
                } else if !leaf.public
                    || leaf.bind.as_ref().is_some_and(|b| module.mentions.contains(b))
                {
                    for target in targets.into_iter().filter(|t| matches!(t, Def::Item(_))) {
                        add(target, leaf.line, format!("use {path}"));
                    }
                }
            }
            for path in &module.paths {
                for target in self.resolve(id, &path.segments, true, 0) {
                    add(target, path.line, path.segments.join("::"));
                }
            }
        }
        edges
    }
}

fn dedup(defs: &mut Vec<Def>) {
    let mut seen = HashSet::new();
    defs.retain(|d| seen.insert(*d));
}

/// A `mod x;` a file declares.
struct Declared {
    parent: ModId,
    name: String,
    line: u32,
    /// Where its file may be, in order.
    candidates: Vec<PathBuf>,
    path_attr: bool,
}

/// Reads one file's tokens into the modules of a [`CrateGraph`].
struct FileParser<'a> {
    graph: &'a mut CrateGraph,
    tokens: &'a [Token],
    file_dir: PathBuf,
}

/// An open brace: a block, or an inline module's body.
enum Frame {
    Block,
    Module(ModId),
}

impl<'a> FileParser<'a> {
    fn tok(&self, i: usize) -> Option<&'a Tok> {
        self.tokens.get(i).map(|t| &t.tok)
    }

    fn ident(&self, i: usize) -> Option<&'a str> {
        match self.tok(i) {
            Some(Tok::Ident(s)) => Some(s),
            _ => None,
        }
    }

    fn is_punct(&self, i: usize, c: char) -> bool {
        self.tok(i) == Some(&Tok::Punct(c))
    }

    /// The index just past the bracket closing the one at `open`.
    fn past_closing(&self, open: usize, (left, right): (char, char)) -> usize {
        let mut depth = 0usize;
        for i in open..self.tokens.len() {
            if self.is_punct(i, left) {
                depth += 1;
            } else if self.is_punct(i, right) {
                depth -= 1;
                if depth == 0 {
                    return i + 1;
                }
            }
        }
        self.tokens.len()
    }

    /// Records the file's modules, items, imports and paths under
    /// `file_module`; returns its `mod x;` declarations.
    fn parse(&mut self, file_module: ModId) -> Vec<Declared> {
        let mut declared = Vec::new();
        let mut frames: Vec<Frame> = Vec::new();
        let (mut macro_export, mut path_attr) = (false, None::<String>);
        let mut public = false;
        let mut i = 0;
        while i < self.tokens.len() {
            let current = frames
                .iter()
                .rev()
                .find_map(|f| match f {
                    Frame::Module(m) => Some(*m),
                    Frame::Block => None,
                })
                .unwrap_or(file_module);
            let module_level = matches!(frames.last(), None | Some(Frame::Module(_)));
            let was_public = std::mem::take(&mut public);
            let line = self.tokens[i].line;
            let after_separator = i > 0 && matches!(self.tok(i - 1), Some(Tok::PathSep));
            let after_dot = i > 0 && self.is_punct(i - 1, '.');
            let Some(tok) = self.tok(i) else { break };
            match tok {
                Tok::Punct('#') => {
                    let open = if self.is_punct(i + 1, '!') { i + 2 } else { i + 1 };
                    if !self.is_punct(open, '[') {
                        i += 1;
                        continue;
                    }
                    let end = self.past_closing(open, ('[', ']'));
                    for j in open + 1..end {
                        if self.ident(j) == Some("macro_export") {
                            macro_export = true;
                        }
                        if self.ident(j) == Some("path")
                            && self.is_punct(j + 1, '=')
                            && let Some(Tok::Str(p)) = self.tok(j + 2)
                        {
                            path_attr = Some(p.clone());
                        }
                    }
                    i = end;
                }
                Tok::Punct(c @ ('{' | '}' | ';')) => {
                    match c {
                        '{' => frames.push(Frame::Block),
                        '}' => drop(frames.pop()),
                        _ => {}
                    }
                    (macro_export, path_attr) = (false, None);
                    i += 1;
                }
                Tok::Ident(w) if w == "pub" => {
                    public = true;
                    i = if self.is_punct(i + 1, '(') {
                        self.past_closing(i + 1, ('(', ')'))
                    } else {
                        i + 1
                    };
                }
                Tok::Ident(w) if w == "use" && !self.is_punct(i + 1, '<') => {
                    let mut leaves = Vec::new();
                    let mut j = i + 1;
                    self.use_tree(&mut j, Vec::new(), &mut leaves);
                    while j < self.tokens.len() && !self.is_punct(j, ';') {
                        j += 1;
                    }
                    for (path, bind, glob) in leaves {
                        self.graph.modules[current].uses.push(UseLeaf {
                            path,
                            bind,
                            glob,
                            public: was_public,
                            module_level,
                            line,
                        });
                    }
                    (macro_export, path_attr) = (false, None);
                    i = j + 1;
                }
                Tok::Ident(w) if w == "mod" && self.ident(i + 1).is_some() => {
                    let name = self.ident(i + 1).unwrap_or_default().to_owned();
                    if self.is_punct(i + 2, ';') {
                        let dir = match &path_attr {
                            Some(_) if current == file_module => &self.file_dir,
                            _ => &self.graph.modules[current].child_dir,
                        };
                        let candidates = match &path_attr {
                            Some(p) => vec![dir.join(p)],
                            None => {
                                vec![dir.join(format!("{name}.rs")), dir.join(&name).join("mod.rs")]
                            }
                        };
                        declared.push(Declared {
                            parent: current,
                            name,
                            line,
                            candidates,
                            path_attr: path_attr.is_some(),
                        });
                        i += 3;
                    } else if self.is_punct(i + 2, '{') {
                        let file = self.graph.modules[current].file;
                        let child_dir = self.graph.modules[current].child_dir.join(&name);
                        let child = self.graph.add_module(current, &name, file, child_dir);
                        frames.push(Frame::Module(child));
                        i += 3;
                    } else {
                        i += 2;
                    }
                    (macro_export, path_attr) = (false, None);
                }
                Tok::Ident(w)
                    if w == "macro_rules"
                        && self.is_punct(i + 1, '!')
                        && self.ident(i + 2).is_some() =>
                {
                    let name = self.ident(i + 2).unwrap_or_default().to_owned();
                    let named_in = if macro_export { 0 } else { current };
                    self.graph.modules[named_in].items.entry(name).or_default().push(current);
                    (macro_export, path_attr) = (false, None);
                    i += 3;
                }
                Tok::Ident(w) if module_level && ITEM_KEYWORDS.contains(&w.as_str()) => {
                    match self.item_name(i) {
                        Some(at) => {
                            let name = self.ident(at).unwrap_or_default().to_owned();
                            self.graph.modules[current]
                                .items
                                .entry(name)
                                .or_default()
                                .push(current);
                            i = at + 1;
                        }
                        None => i += 1,
                    }
                }
                Tok::Ident(first)
                    if !after_separator && matches!(self.tok(i + 1), Some(Tok::PathSep)) =>
                {
                    let mut segments = vec![first.clone()];
                    let mut j = i + 1;
                    while matches!(self.tok(j), Some(Tok::PathSep))
                        && let Some(next) = self.ident(j + 1)
                    {
                        segments.push(next.to_owned());
                        j += 2;
                    }
                    let module = &mut self.graph.modules[current];
                    if !matches!(first.as_str(), "crate" | "super" | "self") {
                        module.mentions.insert(first.clone());
                    }
                    module.paths.push(PathRef { segments, line });
                    i = j;
                }
                Tok::Ident(w) => {
                    if !after_separator && !after_dot {
                        self.graph.modules[current].mentions.insert(w.clone());
                    }
                    i += 1;
                }
                _ => i += 1,
            }
        }
        declared
    }

    /// The index of the name an item keyword at `at` defines, if it is
    /// one (`const fn` and `const _` define none here).
    fn item_name(&self, at: usize) -> Option<usize> {
        let keyword = self.ident(at)?;
        let mut name = at + 1;
        if keyword == "static" && self.ident(name) == Some("mut") {
            name += 1;
        }
        let word = self.ident(name)?;
        let not_a_name = ["fn", "unsafe", "async", "extern", "_", "mut"];
        if not_a_name.contains(&word) {
            return None;
        }
        if keyword == "union" && !(self.is_punct(name + 1, '{') || self.is_punct(name + 1, '<')) {
            return None;
        }
        Some(name)
    }

    /// Reads a `use` tree from `*j`, adding each leaf to `out` as (path,
    /// bound name, glob); a leading `::` is kept as the segment `::`.
    fn use_tree(&self, j: &mut usize, mut path: Vec<String>, out: &mut Vec<UseTreeLeaf>) {
        if matches!(self.tok(*j), Some(Tok::PathSep)) {
            path.push("::".to_owned());
            *j += 1;
        }
        loop {
            match self.tok(*j) {
                Some(Tok::Ident(segment)) => {
                    path.push(segment.clone());
                    *j += 1;
                    if matches!(self.tok(*j), Some(Tok::PathSep)) {
                        *j += 1;
                        continue;
                    }
                    if path.last().is_some_and(|s| s == "self") {
                        path.pop();
                    }
                    let mut bind = path.last().cloned();
                    if self.ident(*j) == Some("as") {
                        bind = self.ident(*j + 1).filter(|b| *b != "_").map(str::to_owned);
                        *j += 2;
                    }
                    out.push((path, bind, false));
                    return;
                }
                Some(Tok::Punct('*')) => {
                    *j += 1;
                    out.push((path, None, true));
                    return;
                }
                Some(Tok::Punct('{')) => {
                    *j += 1;
                    while *j < self.tokens.len() && !self.is_punct(*j, '}') {
                        let before = *j;
                        self.use_tree(j, path.clone(), out);
                        if self.is_punct(*j, ',') {
                            *j += 1;
                        }
                        if *j == before {
                            *j += 1;
                        }
                    }
                    *j += 1;
                    return;
                }
                _ => return,
            }
        }
    }
}

/// A `use` leaf as the tree reader finds it: (path, bound name, glob).
type UseTreeLeaf = (Vec<String>, Option<String>, bool);

// ---- Cycles -------------------------------------------------------------

/// Every cycle of `edges`: the shortest through each edge that has one,
/// each listed once, starting at its least file.
fn cycles(files: &[String], edges: &Edges) -> Vec<Vec<Hop>> {
    let mut next: BTreeMap<usize, Vec<usize>> = BTreeMap::new();
    for &(from, to) in edges.keys() {
        next.entry(from).or_default().push(to);
    }
    let mut found = BTreeSet::new();
    for &(from, to) in edges.keys() {
        if let Some(back) = shortest_path(&next, to, from) {
            let mut cycle: Vec<usize> = std::iter::once(from).chain(back).collect();
            cycle.pop();
            let least = (0..cycle.len()).min_by_key(|&i| &files[cycle[i]]).unwrap_or(0);
            cycle.rotate_left(least);
            found.insert(cycle);
        }
    }
    let mut cycles: Vec<Vec<usize>> = found.into_iter().collect();
    cycles.sort_by_key(|c| (c.len(), c.iter().map(|&f| files[f].clone()).collect::<Vec<_>>()));
    cycles
        .into_iter()
        .map(|cycle| {
            (0..cycle.len())
                .map(|i| {
                    let (from, to) = (cycle[i], cycle[(i + 1) % cycle.len()]);
                    Hop {
                        from: files[from].clone(),
                        to: files[to].clone(),
                        names: ties(&edges[&(from, to)]),
                    }
                })
                .collect()
        })
        .collect()
}

/// What ties an edge, in the order of the lines they are on:
/// `use super::Stack (line 12)`, `reactor::turn (lines 265, 266)`.
fn ties(names: &BTreeMap<String, BTreeSet<u32>>) -> Vec<String> {
    let mut ties: Vec<(&u32, String)> = names
        .iter()
        .filter_map(|(name, lines)| {
            let list: Vec<String> = lines.iter().map(u32::to_string).collect();
            let label = if lines.len() == 1 { "line" } else { "lines" };
            Some((lines.first()?, format!("{name} ({label} {})", list.join(", "))))
        })
        .collect();
    ties.sort();
    ties.into_iter().map(|(_, tie)| tie).collect()
}

/// The files from `start` to `goal`, both included, by the fewest edges.
fn shortest_path(
    next: &BTreeMap<usize, Vec<usize>>,
    start: usize,
    goal: usize,
) -> Option<Vec<usize>> {
    let mut came_from = HashMap::from([(start, start)]);
    let mut queue = VecDeque::from([start]);
    while let Some(file) = queue.pop_front() {
        if file == goal {
            let mut path = vec![goal];
            let mut at = goal;
            while at != start {
                at = came_from[&at];
                path.push(at);
            }
            path.reverse();
            return Some(path);
        }
        for &to in next.get(&file).into_iter().flatten() {
            if let std::collections::hash_map::Entry::Vacant(e) = came_from.entry(to) {
                e.insert(file);
                queue.push_back(to);
            }
        }
    }
    None
}
