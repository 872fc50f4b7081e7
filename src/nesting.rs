//! How deep an input nests and how far its aliases expand, found before
//! any parser builds it: the one bound every front end puts on the YAML
//! and JSON it reads ([`check`]: `xfn start`/`run`'s FunctionIO, render's
//! files and flags, functions' output, `xfn wrap`'s package metadata).
//!
//! Why: yaml_serde reads a whole document into libyaml events before serde
//! sees its first level, and libyaml's scanner walks its stack of open flow
//! levels for every token: `x: ` and 100,000 `[` took 11.9 s. And it builds
//! a copy of an anchored node for every alias to it, bounded by a count of
//! alias jumps, not by what they copy: 1.9 KB of aliases took 1.1 GiB.
//!
//! Choice: **libyaml's own scanner and parser**: a hand-written pre-scan
//! would be a second YAML grammar, and one place it disagreed with libyaml
//! is all an attacker needs. The scan counts collection tokens and stops
//! past [`MAX_DEPTH`] (linear: a token costs at most the bound's worth of
//! work; 100,000 `[` refused in 1–9 ms, a 4 MiB mapping scanned in 127 ms
//! beside a 446 ms parse). Only when it met an alias does the parser run
//! again, for [`aliases`] to weigh the copies by go-yaml v3's rule. JSON is
//! YAML's flow style, so the same check bounds JSON.
//!
//! Nothing here holds a thread it cannot give back: [`check_until`] stops
//! when told to, and [`off_thread`] runs parsing on a blocking thread that
//! a dropped call stops, within a budget of bytes parsed at once
//! ([`PARSE_BUDGET_BYTES`]) that bounds the parsers' memory.
use std::marker::PhantomData;
use std::mem::MaybeUninit;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use libyaml_rs as sys;

/// The deepest nesting any input may have: collections in collections, flow
/// (`[`, `{`) and block (indentation) alike. Kubernetes objects nest about
/// ten deep; a CRD schema takes two levels per level of the object it
/// describes; functions' documents are Kubernetes objects inside FunctionIO
/// (three levels) or a RunFunctionRequest (four). prost refuses protobuf
/// messages nested past 100, which a Struct reaches at 34 levels of its
/// JSON (measured), so a v1 function never sees anything deeper than that
/// anyway; yaml_serde's own recursion limit is 128.
pub(crate) const MAX_DEPTH: usize = 64;

/// Tokens (or events) read between two looks at whether the caller is
/// still there.
const TOKENS_PER_LOOK: u32 = 4096;

/// Why an input was refused before it was parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum NestingError {
    /// Deeper than the bound.
    #[error(
        "nested more than {limit} levels deep (at line {line}, column {column}); refused before parsing"
    )]
    TooDeep {
        /// The bound.
        limit: usize,
        /// 1-based line of the collection past the bound.
        line: u64,
        /// 1-based column of it.
        column: u64,
    },
    /// Its aliases expand past [`aliases::allowed`].
    #[error(
        "its aliases expand too far: copies would be {}.{}% of the ~{total_kib} KiB it parses to, over the {}.{}% allowed at that size (at line {line}, column {column}); refused before parsing",
        .copies_permille / 10, .copies_permille % 10, .allowed_permille / 10, .allowed_permille % 10
    )]
    Aliasing {
        /// Per mille of the parsed size that copies take, rounded up.
        copies_permille: u64,
        /// The per mille allowed at that size, rounded down.
        allowed_permille: u64,
        /// The estimated parsed size, KiB (saturated for a billion laughs).
        total_kib: u64,
        /// 1-based line of the node where the bound was passed.
        line: u64,
        /// 1-based column of it.
        column: u64,
    },
    /// An alias inside the node it names: a copy without end.
    #[error(
        "an alias refers to the node it is inside of (at line {line}, column {column}); refused before parsing"
    )]
    RecursiveAlias {
        /// 1-based line of the alias.
        line: u64,
        /// 1-based column of it.
        column: u64,
    },
    /// An anchor that takes the number yaml_serde gave an anchor already
    /// aliased (a name defined twice, then a new name): yaml_serde would
    /// copy this node for those aliases.
    #[error(
        "an anchor name is defined twice in one document, and yaml_serde would copy the anchor here for aliases to the earlier one (at line {line}, column {column}); give each anchor its own name"
    )]
    RedefinedAnchor {
        /// 1-based line of the anchored node.
        line: u64,
        /// 1-based column of it.
        column: u64,
    },
    /// The caller went away and the scan stopped.
    #[error("the check was stopped: its caller went away")]
    Abandoned,
}

/// Refuses `input` (YAML or JSON) when it nests deeper than [`MAX_DEPTH`]
/// or its aliases expand past [`aliases::allowed`]. Syntax errors are not
/// this check's: where libyaml stops, the check stops, and the parser that
/// runs next reports the error. Every YAML or JSON any caller, file or
/// function gives xfn passes here before a parser reads it.
pub(crate) fn check(input: &[u8]) -> Result<(), NestingError> {
    check_until(input, &AtomicBool::new(false))
}

/// [`check`], stopping with [`NestingError::Abandoned`] once `stop` is set.
pub(crate) fn check_until(input: &[u8], stop: &AtomicBool) -> Result<(), NestingError> {
    let scanned = check_depth_until(input, MAX_DEPTH, stop)?;
    if scanned.aliases {
        aliases::check_until(input, stop)?;
    }
    Ok(())
}

/// What the depth scan saw besides depth.
#[derive(Debug, Clone, Copy, Default)]
struct Scanned {
    /// Whether any alias (`*name`) was among the tokens.
    aliases: bool,
}

/// Refuses `input` when it nests deeper than `limit`; stops with
/// [`NestingError::Abandoned`] once `stop` is set.
fn check_depth_until(
    input: &[u8],
    limit: usize,
    stop: &AtomicBool,
) -> Result<Scanned, NestingError> {
    let mut scanned = Scanned::default();
    let Some(mut parser) = Libyaml::new(input) else {
        // libyaml could not allocate its parser: neither can the real parse.
        return Ok(scanned);
    };
    // Flow levels count as libyaml counts them (a stray `]` at level 0
    // closes nothing); block collections by their start and end tokens.
    let (mut flow, mut block) = (0usize, 0usize);
    let mut until_look = TOKENS_PER_LOOK;
    while let Some((kind, mark)) = parser.next_token() {
        let opened = match kind {
            sys::YAML_FLOW_SEQUENCE_START_TOKEN | sys::YAML_FLOW_MAPPING_START_TOKEN => {
                flow += 1;
                true
            }
            sys::YAML_BLOCK_SEQUENCE_START_TOKEN | sys::YAML_BLOCK_MAPPING_START_TOKEN => {
                block += 1;
                true
            }
            sys::YAML_FLOW_SEQUENCE_END_TOKEN | sys::YAML_FLOW_MAPPING_END_TOKEN => {
                flow = flow.saturating_sub(1);
                false
            }
            sys::YAML_BLOCK_END_TOKEN => {
                block = block.saturating_sub(1);
                false
            }
            sys::YAML_ALIAS_TOKEN => {
                scanned.aliases = true;
                false
            }
            _ => false,
        };
        if opened && flow + block > limit {
            return Err(NestingError::TooDeep {
                limit,
                line: mark.line + 1,
                column: mark.column + 1,
            });
        }
        until_look -= 1;
        if until_look == 0 {
            if stop.load(Ordering::Relaxed) {
                return Err(NestingError::Abandoned);
            }
            until_look = TOKENS_PER_LOOK;
        }
    }
    Ok(scanned)
}

/// libyaml over one input: token by token (its scanner) or event by event
/// (its parser), never both on one instance (libyaml forbids it).
struct Libyaml<'input> {
    /// Boxed: libyaml keeps pointers to the parser's own fields.
    parser: Box<MaybeUninit<sys::yaml_parser_t>>,
    /// The parser reads the input through a raw pointer.
    input: PhantomData<&'input [u8]>,
}

/// One parser event, as much of it as [`aliases`] weighs.
struct Event {
    kind: EventKind,
    /// The anchor a node defines (`&name`), or the one an alias names.
    anchor: Option<Box<[u8]>>,
    mark: sys::yaml_mark_t,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum EventKind {
    DocumentStart,
    Scalar { bytes: u64 },
    CollectionStart,
    CollectionEnd,
    Alias,
    Other,
}

impl<'input> Libyaml<'input> {
    fn new(input: &'input [u8]) -> Option<Self> {
        let mut parser = Box::new(MaybeUninit::<sys::yaml_parser_t>::uninit());
        let raw = parser.as_mut_ptr();
        // SAFETY: `raw` points to boxed memory the size and alignment of a
        // yaml_parser_t, which yaml_parser_initialize writes whole (it
        // zeroes the struct, then allocates its buffers) before anything
        // reads it.
        if unsafe { sys::yaml_parser_initialize(raw) }.fail {
            return None;
        }
        // SAFETY: the parser was initialised above. It keeps `input`'s
        // pointer and length and only reads through them; the lifetime
        // ties it to `input`, so the bytes outlive every read. UTF-8 as
        // yaml_serde sets it, so both read the same characters.
        unsafe {
            sys::yaml_parser_set_encoding(raw, sys::YAML_UTF8_ENCODING);
            sys::yaml_parser_set_input_string(raw, input.as_ptr(), input.len() as u64);
        }
        Some(Self {
            parser,
            input: PhantomData,
        })
    }

    /// The next token's kind and where it starts; `None` at the end of the
    /// stream or at the first error (libyaml stops there for good).
    fn next_token(&mut self) -> Option<(sys::yaml_token_type_t, sys::yaml_mark_t)> {
        let mut token = MaybeUninit::<sys::yaml_token_t>::uninit();
        let parser = self.parser.as_mut_ptr();
        // SAFETY: the parser is initialised (`new`) and its input alive;
        // yaml_parser_scan zeroes `token` before anything else, so it is
        // initialised whether the scan succeeds or fails.
        let scanned = unsafe { sys::yaml_parser_scan(parser, token.as_mut_ptr()) };
        // SAFETY: written by yaml_parser_scan, as above.
        let token = unsafe { token.assume_init_mut() };
        let (kind, mark) = (token.type_, token.start_mark);
        // SAFETY: a token yaml_parser_scan produced, deleted once; a zeroed
        // one (after a failure or at the end) owns nothing to free.
        unsafe { sys::yaml_token_delete(token) };
        if scanned.fail || matches!(kind, sys::YAML_NO_TOKEN | sys::YAML_STREAM_END_TOKEN) {
            return None;
        }
        Some((kind, mark))
    }

    /// The next parser event; `None` at the end of the stream or at the
    /// first error (libyaml stops there for good, and so does yaml_serde's
    /// loader, which reads these same events).
    fn next_event(&mut self) -> Option<Event> {
        let mut event = MaybeUninit::<sys::yaml_event_t>::uninit();
        let parser = self.parser.as_mut_ptr();
        // SAFETY: the parser is initialised (`new`), its input alive, and
        // only ever parsed on this instance (never scanned);
        // yaml_parser_parse zeroes `event` before anything else, so it is
        // initialised whether parsing succeeds or fails.
        let parsed = unsafe { sys::yaml_parser_parse(parser, event.as_mut_ptr()) };
        // SAFETY: written by yaml_parser_parse, as above.
        let event = unsafe { event.assume_init_mut() };
        // SAFETY: each arm reads the union member `type_` says is the one
        // written; anchors are null or nul-terminated strings libyaml
        // allocated and owns until yaml_event_delete below.
        let (kind, anchor) = unsafe {
            match event.type_ {
                sys::YAML_DOCUMENT_START_EVENT => (EventKind::DocumentStart, None),
                sys::YAML_SCALAR_EVENT => (
                    EventKind::Scalar {
                        bytes: event.data.scalar.length,
                    },
                    anchor_of(event.data.scalar.anchor),
                ),
                sys::YAML_SEQUENCE_START_EVENT => (
                    EventKind::CollectionStart,
                    anchor_of(event.data.sequence_start.anchor),
                ),
                sys::YAML_MAPPING_START_EVENT => (
                    EventKind::CollectionStart,
                    anchor_of(event.data.mapping_start.anchor),
                ),
                sys::YAML_SEQUENCE_END_EVENT | sys::YAML_MAPPING_END_EVENT => {
                    (EventKind::CollectionEnd, None)
                }
                sys::YAML_ALIAS_EVENT => (EventKind::Alias, anchor_of(event.data.alias.anchor)),
                _ => (EventKind::Other, None),
            }
        };
        let (type_, mark) = (event.type_, event.start_mark);
        // SAFETY: an event yaml_parser_parse produced, deleted once; a
        // zeroed one (after a failure or at the end) owns nothing to free.
        unsafe { sys::yaml_event_delete(event) };
        if parsed.fail || matches!(type_, sys::YAML_NO_EVENT | sys::YAML_STREAM_END_EVENT) {
            return None;
        }
        Some(Event { kind, anchor, mark })
    }
}

/// The bytes of a libyaml anchor, `None` for a null pointer.
///
/// # Safety
/// `anchor` is null or a nul-terminated string alive for the call.
unsafe fn anchor_of(anchor: *const u8) -> Option<Box<[u8]>> {
    if anchor.is_null() {
        return None;
    }
    // SAFETY: non-null and nul-terminated, as the caller promises.
    let bytes = unsafe { std::ffi::CStr::from_ptr(anchor.cast()) }.to_bytes();
    Some(bytes.into())
}

impl Drop for Libyaml<'_> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new` (a Libyaml exists only then) and
        // deleted once, here.
        unsafe { sys::yaml_parser_delete(self.parser.as_mut_ptr()) }
    }
}

mod aliases;

/// Alias bombs of the shapes issue 31 sent, each a one-line flow mapping
/// that fits wherever a value does.
#[cfg(test)]
pub(crate) mod bombs {
    /// 1.9 KB of wide aliases: 250 copies of 100 copies of 400 items, ten
    /// million nodes once built.
    pub(crate) fn wide() -> String {
        format!(
            "{{a: &a [{}], b: &b [{}], c: [{}]}}",
            ["x"; 400].join(","),
            ["*a"; 100].join(","),
            ["*b"; 250].join(",")
        )
    }

    /// One 500 KB list (1,000 items of 500 bytes) referenced 1,000 times.
    pub(crate) fn listed() -> String {
        let item = "y".repeat(499);
        let list = vec![item.as_str(); 1000].join(",");
        format!("{{a: &a [{list}], b: [{}]}}", ["*a"; 1000].join(","))
    }

    /// A billion laughs: nine levels of ten aliases to the level below.
    pub(crate) fn laughs() -> String {
        let mut levels = vec![format!("l0: &l0 [{}]", ["lol"; 10].join(","))];
        for level in 1..9 {
            let prev = format!("*l{}", level - 1);
            levels.push(format!(
                "l{level}: &l{level} [{}]",
                [prev.as_str(); 10].join(",")
            ));
        }
        format!("{{{}}}", levels.join(", "))
    }
}

/// Set when the future of [`off_thread`] is dropped: the work on the
/// blocking thread looks at it and stops.
#[derive(Debug, Clone, Default)]
pub(crate) struct Abandoned(Arc<AtomicBool>);

impl Abandoned {
    /// The flag, for [`check_until`].
    pub(crate) fn flag(&self) -> &AtomicBool {
        &self.0
    }
}

/// Raises the flag when dropped (the call's future went away).
struct RaiseOnDrop(Abandoned);

impl Drop for RaiseOnDrop {
    fn drop(&mut self) {
        self.0 .0.store(true, Ordering::Relaxed);
    }
}

/// Bytes of input parsed at once, over all calls. yaml_serde holds a whole
/// document's events, then the value: about 80 times the input (a 4 MiB
/// FunctionIO peaks at 316–346 MiB), so eight inputs at the cap parsed at
/// once would take more than the 2 GiB a sidecar is given. Within this
/// budget (about 700 MiB of parser memory) parsing waits its turn; calls
/// with small inputs, Crossplane's kind, hardly ever wait.
pub(crate) const PARSE_BUDGET_BYTES: usize = 8 << 20;

/// An input this large gives its parser's freed memory back to the kernel
/// once parsed ([`crate::resident::trim_heap`]): glibc keeps what a thread
/// freed in that thread's arena, and calls served on several threads
/// (`grpc::threads`, each with its blocking threads) parse in several
/// arenas, each holding its last large parse's ~80× the input after it
/// ended. Measured (`server_bounds::large_inputs_at_once_are_parsed_
/// within_the_memory_budget`, six 4 MiB inputs): 1085–1122 MiB peak
/// without, 726 MiB with (934 MiB before the serving threads).
const TRIM_AFTER_BYTES: usize = 1 << 20;

/// One permit per KiB of [`PARSE_BUDGET_BYTES`].
const PERMIT_BYTES: usize = 1 << 10;

static PARSE_BUDGET: std::sync::LazyLock<Arc<tokio::sync::Semaphore>> =
    std::sync::LazyLock::new(|| {
        Arc::new(tokio::sync::Semaphore::new(
            PARSE_BUDGET_BYTES / PERMIT_BYTES,
        ))
    });

/// The permits an input of `bytes` takes: at least one, at most the whole
/// budget (an input past it is parsed alone).
fn permits_for(bytes: usize) -> u32 {
    let total = PARSE_BUDGET_BYTES / PERMIT_BYTES;
    bytes.div_ceil(PERMIT_BYTES).clamp(1, total) as u32
}

/// Runs `work` (checking and parsing an input of `bytes`) on a blocking
/// thread, so a large input never holds one of the few async threads every
/// other call needs, and within [`PARSE_BUDGET_BYTES`], so concurrent large
/// inputs cannot take the daemon's memory. Dropping the returned future
/// (the caller went away) while it waits for its share of the budget runs
/// nothing; while `work` runs, it raises the flag `work` is given, which
/// [`check_until`] obeys, and what runs after the check is bounded
/// by it. `None` when `work` panicked.
pub(crate) async fn off_thread<T, F>(bytes: usize, work: F) -> Option<T>
where
    T: Send + 'static,
    F: FnOnce(&Abandoned) -> T + Send + 'static,
{
    let permit = PARSE_BUDGET
        .clone()
        .acquire_many_owned(permits_for(bytes))
        .await
        .ok()?;
    let abandoned = Abandoned::default();
    let _raise = RaiseOnDrop(abandoned.clone());
    tokio::task::spawn_blocking(move || {
        // Held until the work is done, whether or not anyone still waits.
        let _permit = permit;
        let parsed = work(&abandoned);
        if bytes >= TRIM_AFTER_BYTES {
            crate::resident::trim_heap();
        }
        parsed
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_depth(input: &[u8], limit: usize) -> Result<(), NestingError> {
        check_depth_until(input, limit, &AtomicBool::new(false)).map(|_| ())
    }

    fn depth_ok(input: &str, limit: usize) -> bool {
        check_depth(input.as_bytes(), limit).is_ok()
    }

    #[test]
    fn flow_and_block_nesting_both_count() {
        assert!(depth_ok("a: [[1]]", 3));
        assert!(!depth_ok("a: [[[1]]]", 3));
        assert!(depth_ok("- - x", 2));
        assert!(!depth_ok("- - - x", 2));
        // A block mapping holding a flow sequence holding a flow mapping.
        assert!(depth_ok("a:\n  b: [{c: 1}]\n", 4));
        assert!(!depth_ok("a:\n  b: [{c: 1}]\n", 3));
        // Closed collections give their depth back.
        assert!(depth_ok(&"[[]],".repeat(1000).replace(",", "\n- "), 4));
        assert!(depth_ok(&format!("[{}]", "[[]],".repeat(1000)), 3));
    }

    #[test]
    fn brackets_in_quotes_comments_and_block_scalars_are_text() {
        let deep = "[".repeat(500);
        for text in [
            format!("a: \"{deep}\"\n"),
            format!("a: '{deep}'\n"),
            format!("a: x {deep}\n"),
            format!("# {deep}\na: 1\n"),
            format!("a: |\n  {deep}\nb: 1\n"),
            format!("a: >-\n  {deep}\n  {deep}\nb: 1\n"),
        ] {
            assert!(depth_ok(&text, 3), "{text}");
        }
    }

    #[test]
    fn what_libyaml_reads_as_flow_counts_wherever_it_hides() {
        // Each: text a naive scanner might skip, but libyaml reads as flow.
        let deep = "[".repeat(100);
        for text in [
            // `#` right after a flow indicator starts a comment only for
            // libyaml; the next line is flow again.
            format!("a: [#x\n{deep}"),
            // U+2028 ends a comment for libyaml.
            format!("# c\u{2028}{deep}"),
            // A tag ends at `,` in flow context.
            format!("[!t,{deep}"),
            // A quote inside a plain scalar is no quote.
            format!("a: it's\nb: {deep}"),
        ] {
            assert!(!depth_ok(&text, MAX_DEPTH), "{text:?}");
        }
    }

    #[test]
    fn json_is_bounded_too() {
        let deep = format!("{}1{}", "[".repeat(65), "]".repeat(65));
        assert!(!depth_ok(&deep, MAX_DEPTH));
        let deep = format!("{}1{}", "{\"a\":".repeat(65), "}".repeat(65));
        assert!(!depth_ok(&deep, MAX_DEPTH));
        let fine = format!("{}1{}", "{\"a\":".repeat(60), "}".repeat(60));
        assert!(depth_ok(&fine, MAX_DEPTH));
    }

    #[test]
    fn the_refusal_names_the_place_past_the_bound() {
        let err = check_depth(b"a:\n  - [[[1]]]\n", 3).unwrap_err();
        assert_eq!(
            err,
            NestingError::TooDeep {
                limit: 3,
                line: 2,
                column: 6
            }
        );
    }

    #[test]
    fn syntax_errors_are_left_to_the_parser() {
        assert!(depth_ok("a: [unclosed", MAX_DEPTH));
        assert!(depth_ok("\u{0}\u{1}", MAX_DEPTH));
        assert!(depth_ok("", MAX_DEPTH));
        // Invalid UTF-8 stops libyaml, and the scan, where it starts.
        assert!(check_depth(b"a: [\xff[[[[[[", 2).is_ok());
    }

    #[test]
    fn a_raised_flag_stops_the_scan() {
        let long = "[],".repeat(10_000);
        let stop = AtomicBool::new(true);
        assert_eq!(
            check_until(long.as_bytes(), &stop),
            Err(NestingError::Abandoned)
        );
    }

    #[test]
    fn inputs_take_their_share_of_the_parse_budget_and_never_more_than_all() {
        assert_eq!(permits_for(0), 1);
        assert_eq!(permits_for(100), 1);
        assert_eq!(permits_for(4 << 20), 4096);
        assert_eq!(permits_for(64 << 20), 8192);
    }

    #[tokio::test]
    async fn a_caller_gone_while_waiting_for_the_budget_runs_nothing() {
        // The whole budget is taken, by an input past it.
        let (release_tx, release_rx) = std::sync::mpsc::channel::<()>();
        let big = tokio::spawn(off_thread(PARSE_BUDGET_BYTES * 2, move |_: &Abandoned| {
            release_rx.recv().unwrap();
        }));
        while PARSE_BUDGET.available_permits() != 0 {
            tokio::task::yield_now().await;
        }
        let ran = Arc::new(AtomicBool::new(false));
        let flag = ran.clone();
        let waiting = tokio::spawn(off_thread(1, move |_: &Abandoned| {
            flag.store(true, Ordering::Relaxed);
        }));
        tokio::task::yield_now().await;
        waiting.abort();
        assert!(waiting.await.unwrap_err().is_cancelled());
        release_tx.send(()).unwrap();
        big.await.unwrap().unwrap();
        assert!(!ran.load(Ordering::Relaxed));
    }

    #[tokio::test]
    async fn a_dropped_caller_raises_the_flag_its_work_sees() {
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let (seen_tx, seen_rx) = std::sync::mpsc::channel();
        let call = off_thread(1, move |abandoned: &Abandoned| {
            started_tx.send(()).unwrap();
            while !abandoned.flag().load(Ordering::Relaxed) {
                std::thread::yield_now();
            }
            seen_tx.send(()).unwrap();
        });
        let call = tokio::spawn(call);
        tokio::task::spawn_blocking(move || started_rx.recv().unwrap())
            .await
            .unwrap();
        call.abort();
        tokio::task::spawn_blocking(move || seen_rx.recv().unwrap())
            .await
            .unwrap();
    }
}
