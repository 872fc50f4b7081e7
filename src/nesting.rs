//! How deep an input nests, found before any parser builds it: the one
//! bound every front end puts on the YAML and JSON it is given (`xfn
//! start`'s FunctionIO, render's files, a function's JSON output).
//!
//! Why: yaml_serde reads a whole document into libyaml events before serde
//! sees its first level, so its recursion limit (128) refuses deep input
//! only after all of it was scanned; and libyaml's scanner walks its stack
//! of open flow levels for every token, so input nested N levels deep costs
//! O(N²): `x: ` and 100,000 `[` took 11.9 s, the 4 MiB input cap would take
//! hours, on whichever thread parses it, after its caller gave up.
//!
//! Choice: **libyaml's own scanner, stopped at the bound.** The scan counts
//! the collection start and end tokens libyaml itself produces and stops at
//! the first one past [`MAX_DEPTH`], or where libyaml stops (a syntax error
//! the parser then reports). A hand-written pre-scan would be a second YAML
//! grammar, and wherever it disagreed with libyaml — a `#` right after a
//! flow indicator, a tag that ends at `,`, U+2028 as a line break, which
//! lines continue a plain scalar, where a block scalar ends — input it took
//! for shallow text would be deep flow to the parser, and one such
//! disagreement is all an attacker needs. libyaml cannot disagree with
//! itself. The cost is one scan, linear in the input: a token costs at
//! most the bound's worth of work, because the depth never passes it.
//! JSON is YAML's flow style, so the same scan bounds JSON; serde_json's
//! own limit (128) is linear and stays behind it.
//!
//! Measured (release build, 2 cores loaded by a build): `x: ` and 25,000 /
//! 50,000 / 100,000 `[` took yaml_serde 1.7 / 9.8 / 26 s; the scan refuses
//! each in 1–9 ms, and 4 MiB of them in 0.2 ms (it stops at the 65th
//! level). What passes costs about a third of the parse that follows: a
//! 4 MiB mapping 127 ms beside 446 ms; 4 MiB of `[],` nested 32 deep, the
//! expensive shape within the bound, 414 ms beside 648 ms.
//!
//! The scan holds no thread it cannot give back: [`check_depth_until`]
//! stops when told to (its caller went away), and [`off_thread`] runs
//! parsing on a blocking thread that a dropped call stops, within a budget
//! of bytes parsed at once ([`PARSE_BUDGET_BYTES`]) that bounds the
//! parsers' memory.
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
pub const MAX_DEPTH: usize = 64;

/// Tokens scanned between two looks at whether the caller is still there.
const TOKENS_PER_LOOK: u32 = 4096;

/// Why an input was refused before it was parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum NestingError {
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
    /// The caller went away and the scan stopped.
    #[error("the check was stopped: its caller went away")]
    Abandoned,
}

/// Refuses `input` (YAML or JSON) when it nests deeper than `limit`.
/// Syntax errors are not this check's: where libyaml stops, the scan
/// stops, and the parser that runs next reports the error.
pub fn check_depth(input: &[u8], limit: usize) -> Result<(), NestingError> {
    check_depth_until(input, limit, &AtomicBool::new(false))
}

/// [`check_depth`], stopping with [`NestingError::Abandoned`] once `stop`
/// is set.
pub fn check_depth_until(
    input: &[u8],
    limit: usize,
    stop: &AtomicBool,
) -> Result<(), NestingError> {
    let Some(mut scanner) = Scanner::new(input) else {
        // libyaml could not allocate its parser: neither can the real parse.
        return Ok(());
    };
    // Flow levels count as libyaml counts them (a stray `]` at level 0
    // closes nothing); block collections by their start and end tokens.
    let (mut flow, mut block) = (0usize, 0usize);
    let mut until_look = TOKENS_PER_LOOK;
    while let Some((kind, mark)) = scanner.next() {
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
    Ok(())
}

/// libyaml's scanner over one input, token by token.
struct Scanner<'input> {
    /// Boxed: libyaml keeps pointers to the parser's own fields.
    parser: Box<MaybeUninit<sys::yaml_parser_t>>,
    /// The parser reads the input through a raw pointer.
    input: PhantomData<&'input [u8]>,
}

impl<'input> Scanner<'input> {
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
        // pointer and length and only reads through them; the scanner's
        // lifetime ties it to `input`, so the bytes outlive every read.
        // UTF-8 as yaml_serde sets it, so both read the same characters.
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
    fn next(&mut self) -> Option<(sys::yaml_token_type_t, sys::yaml_mark_t)> {
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
}

impl Drop for Scanner<'_> {
    fn drop(&mut self) {
        // SAFETY: initialised in `new` (a Scanner exists only then) and
        // deleted once, here.
        unsafe { sys::yaml_parser_delete(self.parser.as_mut_ptr()) }
    }
}

/// Set when the future of [`off_thread`] is dropped: the work on the
/// blocking thread looks at it and stops.
#[derive(Debug, Clone, Default)]
pub struct Abandoned(Arc<AtomicBool>);

impl Abandoned {
    /// The flag, for [`check_depth_until`].
    pub fn flag(&self) -> &AtomicBool {
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
pub const PARSE_BUDGET_BYTES: usize = 8 << 20;

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
/// [`check_depth_until`] obeys, and what runs after the check is bounded
/// by it. `None` when `work` panicked.
pub async fn off_thread<T, F>(bytes: usize, work: F) -> Option<T>
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
        work(&abandoned)
    })
    .await
    .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

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
            check_depth_until(long.as_bytes(), MAX_DEPTH, &stop),
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
