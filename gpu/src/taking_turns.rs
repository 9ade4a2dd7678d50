//! Work spread over threads that take turns: each thread takes the next item no thread has
//! taken yet, so one slow item (the driver compiling a large convolution, naga parsing one)
//! holds up one thread, not a fixed share of the list. Compiling a plan's pipelines and
//! checking its kernels at build time both run this way.

use std::sync::atomic::{AtomicUsize, Ordering};

/// `f` of every item on up to `max_threads` threads (never more than the machine's cores or
/// the items), while this thread runs `during`. Results come in the items' order; an item whose
/// thread panicked — taking the results it had made with it — is `None`.
pub fn map_taking_turns<T: Sync, R: Send, D>(
    items: &[T],
    max_threads: usize,
    f: impl Fn(&T) -> R + Sync,
    during: impl FnOnce() -> D,
) -> (Vec<Option<R>>, D) {
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    let threads = cores.min(max_threads).min(items.len()).max(1);
    let next = AtomicUsize::new(0);
    let (done, d): (Vec<(usize, R)>, D) = std::thread::scope(|scope| {
        let jobs: Vec<_> = (0..threads)
            .map(|_| {
                scope.spawn(|| {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(item) = items.get(i) else { break mine };
                        mine.push((i, f(item)));
                    }
                })
            })
            .collect();
        let d = during();
        (jobs.into_iter().flat_map(|j| j.join().unwrap_or_default()).collect(), d)
    });
    let mut out: Vec<Option<R>> = (0..items.len()).map(|_| None).collect();
    for (i, r) in done {
        out[i] = Some(r);
    }
    (out, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn results_keep_the_items_order_whatever_the_threads() {
        let items: Vec<u64> = (0..257).collect();
        for threads in [1, 2, 7, 64] {
            let (out, during) = map_taking_turns(&items, threads, |&x| x * x, || "ran");
            let out: Vec<u64> = out.into_iter().map(Option::unwrap).collect();
            assert_eq!(out, items.iter().map(|x| x * x).collect::<Vec<_>>());
            assert_eq!(during, "ran");
        }
    }

    #[test]
    fn no_items_still_runs_the_caller_work() {
        let (out, during) = map_taking_turns(&[] as &[u8], 4, |_| 0u8, || 5);
        assert!(out.is_empty());
        assert_eq!(during, 5);
    }

    #[test]
    fn a_panicking_item_loses_only_its_threads_results() {
        let items: Vec<u32> = (0..40).collect();
        let (out, ()) = map_taking_turns(
            &items,
            1,
            |&x| {
                assert!(x != 30, "item 30 fails");
                x
            },
            || (),
        );
        // One thread: everything it made before the panic is lost with it.
        assert!(out.iter().all(Option::is_none));
        let (out, ()) = map_taking_turns(&items, 1, |&x| x + 1, || ());
        assert!(out.iter().all(Option::is_some));
    }
}
