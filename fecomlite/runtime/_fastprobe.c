/* The probe's hot path in C: time a call and append it to the event buffer.
 *
 * Why C: a Python wrapper costs ~400 ns a call on a 2-core machine (argument packing, two
 * time.monotonic_ns() calls, a tuple, thread id), and serialising the events again costs as much.
 * Here the call is forwarded with vectorcall (no packing) and a call costs, besides the callee:
 * the site's id from a cache keyed by the site key object's address (no hashing), two stamps of
 * the TSC where it is invariant (else CLOCK_MONOTONIC, the clock time.monotonic_ns reads), a push
 * and pop on this thread's stack of calls in progress (a thread-local pointer, no hashing), and one
 * fixed-size record written to the buffer. drain() turns the records into columns (sites by
 * name, stamps in CLOCK_MONOTONIC ns), ready to send. fecomlite/runtime/probe.py falls back to
 * pure Python without it.
 * All state is touched with the GIL held, so appends and drains never interleave.
 * To compilers the module is invisible: compilers.py registers `call` and `dcall` with dynamo as
 * the plain fn(*args, **kwargs).
 *
 * No Python frame of the probe stands between the user's frame and the callee on any path: the
 * sized path calls the Python helpers `before(...)` and `after(...)` around a direct call of fn
 * (caller-frame APIs such as `torch.fx.wrap`, TorchScript's scope lookup, `warnings` attribution
 * and `inspect.stack()` see the user's frame).
 *
 * dcall(site, fn, ...): a call whose callee the instrumenter could not name. The callee is looked
 * at once per site (and again when what it is changes: `callee_key`); a framework callee takes
 * `call`, anything else is called straight through (a dict lookup and a compare).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <pythread.h>
#include <stdint.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <pthread.h>

#define LIKELY(x) __builtin_expect(!!(x), 1)
#define UNLIKELY(x) __builtin_expect(!!(x), 0)

/* Sites by number: the first time a site key object is seen it gets a small id (equal keys share
 * one), kept in `site_names` with a reference for the process's life; the hot path finds it in a
 * direct-mapped cache by the key object's address (a site key is a constant of the user's code:
 * one object per site), one compare on a hit. The slot holds a reference to the key, so its
 * address cannot be reused while it is cached. Each id has a flag byte: SITE_FAST, the site is
 * past its sized calls (`set_fast`; probe.py's `_fast` reads and changes these flags, the only
 * record of them when the C probe is built). */
#define SITE_CACHE_SLOTS 4096
#define SITE_FAST 1
typedef struct {
    PyObject *site;
    uint32_t id;
} SiteSlot;

static SiteSlot site_cache[SITE_CACHE_SLOTS];
static PyObject *site_ids = NULL; /* site key -> id (int) */
static PyObject **site_names = NULL; /* id -> site key (a reference) */
static uint8_t *site_flags = NULL;   /* id -> SITE_* bits */
static uint32_t n_sites = 0, sites_cap = 0;

static int sites_fd = -1; /* the run's site table file: each new site's key is appended */

/* Appends a site's key (u32 length, UTF-8) to the site table file, in one write, before any
 * record names its id; a failed write stops the table (records then name ids it lacks, and the
 * runner counts them lost). */
static int site_to_file(PyObject *site) {
    if (sites_fd < 0) return 0;
    PyObject *text = PyObject_Str(site);
    Py_ssize_t size;
    const char *utf8 = text ? PyUnicode_AsUTF8AndSize(text, &size) : NULL;
    if (!utf8) { Py_XDECREF(text); return -1; }
    char *entry = PyMem_Malloc((size_t)size + 4);
    if (!entry) { Py_DECREF(text); PyErr_NoMemory(); return -1; }
    uint32_t length = (uint32_t)size;
    memcpy(entry, &length, 4);
    memcpy(entry + 4, utf8, (size_t)size);
    if (write(sites_fd, entry, (size_t)size + 4) != size + 4) sites_fd = -1;
    PyMem_Free(entry);
    Py_DECREF(text);
    return 0;
}

static int new_site_id(PyObject *site, uint32_t *id) {
    if (n_sites == sites_cap) {
        uint32_t cap = sites_cap ? sites_cap * 2 : 1024;
        PyObject **names = PyMem_Realloc(site_names, (size_t)cap * sizeof(PyObject *));
        if (!names) { PyErr_NoMemory(); return -1; }
        site_names = names;
        uint8_t *flags = PyMem_Realloc(site_flags, cap);
        if (!flags) { PyErr_NoMemory(); return -1; }
        site_flags = flags;
        sites_cap = cap;
    }
    PyObject *number = PyLong_FromUnsignedLong(n_sites);
    if (!number || PyDict_SetItem(site_ids, site, number) < 0) {
        Py_XDECREF(number);
        return -1;
    }
    Py_DECREF(number);
    if (site_to_file(site) < 0) return -1;
    site_names[n_sites] = Py_NewRef(site);
    site_flags[n_sites] = 0;
    *id = n_sites++;
    return 0;
}

/* The id of an equal key seen before (or a new one), put in the key object's cache slot. */
static int site_id_slow(PyObject *site, SiteSlot *slot, uint32_t *id) {
    if (!site_ids && !(site_ids = PyDict_New())) return -1;
    PyObject *known = PyDict_GetItemWithError(site_ids, site);
    if (known) *id = (uint32_t)PyLong_AsUnsignedLong(known);
    else if (PyErr_Occurred() || new_site_id(site, id) < 0) return -1;
    Py_INCREF(site);
    Py_XSETREF(slot->site, site);
    slot->id = *id;
    return 0;
}

/* The id of a site seen before: 1 when known, 0 when not (none is made), -1 on an error. */
static int known_site_id(PyObject *site, uint32_t *id) {
    SiteSlot *slot = &site_cache[((uintptr_t)site >> 4) & (SITE_CACHE_SLOTS - 1)];
    if (slot->site == site) {
        *id = slot->id;
        return 1;
    }
    if (!site_ids) return 0;
    PyObject *known = PyDict_GetItemWithError(site_ids, site);
    if (!known) return PyErr_Occurred() ? -1 : 0;
    *id = (uint32_t)PyLong_AsUnsignedLong(known);
    return 1;
}

static inline int site_id(PyObject *site, uint32_t *id) {
    SiteSlot *slot = &site_cache[((uintptr_t)site >> 4) & (SITE_CACHE_SLOTS - 1)];
    if (LIKELY(slot->site == site)) {
        *id = slot->id;
        return 0;
    }
    return site_id_slow(site, slot, id);
}

/* The clock. CLOCK_MONOTONIC (what time.monotonic_ns reads) through the vDSO costs ~22 ns a
 * read here; the TSC ~10 ns. Where the TSC is invariant (probe.py checks `constant_tsc` and
 * `nonstop_tsc`, and `use_tsc` turns it on) the fast path stamps calls in TSC ticks, and every
 * tick is turned into CLOCK_MONOTONIC ns before it leaves the probe (`drain`, `open_calls`):
 * each drain reads a fresh pair (tick, ns) — an anchor — and a tick is placed by linear
 * interpolation between the two anchors around it, so the conversion follows CLOCK_MONOTONIC's
 * own rate (NTP slews it) with an error of the anchors' reading jitter (a few ns). Elsewhere,
 * or with FECOMLITE_CLOCK=monotonic, every stamp is CLOCK_MONOTONIC ns: the fallback. */
static inline int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

#if defined(__x86_64__) || defined(__i386__)
#include <x86intrin.h>
#define HAVE_TSC 1
static inline int64_t ticks(void) { return (int64_t)__rdtsc(); }
#else
#define HAVE_TSC 0
static inline int64_t ticks(void) { return now_ns(); }
#endif

enum { CLOCK_NS = 0, CLOCK_TICKS = 1 }; /* what a stamp counts */
static int stamp_clock = CLOCK_NS;

/* A stamp of the clock given (CLOCK_TICKS or CLOCK_NS); stamp(): of the active one. A call's end
 * is stamped on its start's clock, whatever use_tsc() did meanwhile. */
static inline int64_t stamp_on(int clock) {
    return LIKELY(clock == CLOCK_TICKS) ? ticks() : now_ns();
}
static inline int64_t stamp(void) { return stamp_on(stamp_clock); }

typedef struct {
    int64_t tick, ns;
} Anchor;

/* The anchors kept: the first one read, and a ring of the latest (one per drain, the newest
 * replaced while it is younger than ANCHOR_MERGE_NS, so back-to-back drains do not push the
 * older ones out). */
#define ANCHORS 64
#define ANCHOR_MERGE_NS 50000000LL
static Anchor first_anchor, anchors[ANCHORS];
static int n_anchors = 0, newest_anchor = -1;

static void anchor_to_ring(void);
static void first_rate(void);

/* (tick, ns) read together: the narrowest of a few tick-ns-tick reads, the ns placed mid-way. */
static Anchor read_anchor(void) {
    Anchor best = {0, 0};
    int64_t width = INT64_MAX;
    for (int k = 0; k < 8; k++) {
        int64_t a = ticks(), ns = now_ns(), b = ticks();
        if (b - a < width) {
            width = b - a;
            best.tick = a + (b - a) / 2;
            best.ns = ns;
        }
    }
    return best;
}

static void push_anchor(void) {
    Anchor now = read_anchor();
    if (n_anchors == 0) first_anchor = now;
    if (n_anchors >= 2) {
        Anchor *older = &anchors[(newest_anchor + ANCHORS - 1) % ANCHORS];
        if (now.ns - older->ns < ANCHOR_MERGE_NS) {
            anchors[newest_anchor] = now;
            anchor_to_ring();
            return;
        }
    }
    newest_anchor = (newest_anchor + 1) % ANCHORS;
    anchors[newest_anchor] = now;
    if (n_anchors < ANCHORS) n_anchors++;
    anchor_to_ring();
}

static inline int64_t between(const Anchor *lo, const Anchor *hi, int64_t tick) {
    if (hi->tick == lo->tick) return lo->ns;
    return lo->ns + (int64_t)((double)(tick - lo->tick) * (double)(hi->ns - lo->ns) /
                              (double)(hi->tick - lo->tick));
}

/* A tick in CLOCK_MONOTONIC ns: between the kept anchors around it (the newest segment first:
 * most ticks are in it); past the newest, along the newest segment; before the oldest kept, on
 * the line from the first anchor to it. Call push_anchor() first: there are two anchors then. */
static int64_t tick_ns(int64_t tick) {
    const Anchor *hi = &anchors[newest_anchor];
    for (int k = 1; k < n_anchors; k++) {
        const Anchor *lo = &anchors[(newest_anchor + ANCHORS - k) % ANCHORS];
        if (tick >= lo->tick || k == n_anchors - 1) {
            if (tick < lo->tick && first_anchor.tick < lo->tick) return between(&first_anchor, lo, tick);
            return between(lo, hi, tick);
        }
        hi = lo;
    }
    return between(&first_anchor, hi, tick); /* one anchor: n_anchors == 1 */
}

static inline int64_t stamp_ns(int64_t value, int clock) {
    return clock == CLOCK_TICKS ? tick_ns(value) : value;
}

/* tick_ns for many stamps: those in the newest segment (most of a drain's) by one multiply. */
typedef struct {
    Anchor lo;
    double slope;
} Segment;

static Segment newest_segment(void) {
    Segment s = {anchors[newest_anchor], 0.0};
    if (n_anchors < 2) return s;
    const Anchor *hi = &anchors[newest_anchor];
    s.lo = anchors[(newest_anchor + ANCHORS - 1) % ANCHORS];
    if (hi->tick != s.lo.tick)
        s.slope = (double)(hi->ns - s.lo.ns) / (double)(hi->tick - s.lo.tick);
    return s;
}

static inline int64_t segment_ns(const Segment *s, int64_t value, int clock) {
    if (clock != CLOCK_TICKS) return value;
    if (value >= s->lo.tick && s->slope > 0.0)
        return s->lo.ns + (int64_t)((double)(value - s->lo.tick) * s->slope);
    return tick_ns(value);
}

/* The event buffer: one fixed-size record a call, written in one go. */
typedef struct {
    int64_t t0, t1;
    uint64_t tid;
    int64_t in_bytes, out_bytes;
    uint32_t site;  /* a site id */
    uint8_t status; /* RAISED | CONTINUES (batch_codec) */
    uint8_t clock;  /* CLOCK_NS or CLOCK_TICKS: what t0 and t1 count */
    uint8_t pad[2];
} Record;

/* Where records go: inside a run, a ring in a file mapped shared (`set_ring`, laid out by
 * fecomlite/runtime/event_ring.py), which outlives the process: after an os._exit, a SIGKILL,
 * a SIGSEGV or an OOM kill the runner reads the records not yet sent (from `sent` to `ring_end`)
 * and stores them. A record is written whole before `ring_end` moves past it (crash-consistent:
 * a store by this thread, seen in this order by anyone who reads the file after the death). A
 * record that finds the ring full (the flusher fell behind by a ring's worth), or no ring, goes
 * to `overflow`, in memory; once the overflow holds records, later ones follow them there until
 * a drain, so the order is kept. `ring_end` + `overflowed` counts every record: what a death lost
 * is then exactly that less what was stored. */
typedef struct {
    char magic[8];
    uint32_t record_size, capacity; /* capacity: a power of two */
    uint64_t overflowed;             /* records that went to the overflow */
    uint64_t ring_end;               /* records written to the ring so far */
    uint64_t sent;                   /* ring records whose batch was posted, spooled or lost */
    int64_t seq;                     /* id of the latest batch taken (-1: none) */
    uint64_t batch_end;              /* that batch's ring records end here */
    uint32_t anchor_newest, n_anchors; /* n_anchors: 0, or 1 when the anchors below are set */
    Anchor first_anchor, anchors[2]; /* the first and (anchors[anchor_newest]) the newest */
} RingHeader;

#define RING_HEADER_SIZE 128
static RingHeader *ring_head = NULL;
static Record *ring = NULL;
static uint64_t ring_mask = 0;
static uint64_t drained = 0, drain_end = 0; /* ring records taken by drain() */
static Py_buffer ring_view;
static int ring_held = 0; /* ring_view holds the mapping (a forked child's too, unused) */

static Record *records = NULL; /* the overflow */
static Py_ssize_t n_records = 0, records_cap = 0;

static int grow(void) {
    Py_ssize_t cap = records_cap ? records_cap * 2 : 4096;
    Record *more = PyMem_Realloc(records, (size_t)cap * sizeof(Record));
    if (!more) { PyErr_NoMemory(); return -1; }
    records = more;
    records_cap = cap;
    return 0;
}

/* Where the next record goes: the ring's next slot (`*in_ring` set; published by `commit`), or
 * the overflow's (counted at once); NULL when the overflow cannot grow. The record is then
 * written field by field in place: a copy of a record built on the stack costs three
 * store-forwarding stalls a call (its 16-byte loads span the 8-byte stores that built it). */
static Record *overflow_slot(void) {
    if (n_records == records_cap && grow() < 0) return NULL;
    if (ring_head) ring_head->overflowed++;
    return &records[n_records++];
}

static inline Record *next_record(int *in_ring) {
    RingHeader *h = ring_head;
    if (LIKELY(h != NULL && n_records == 0)) {
        uint64_t end = h->ring_end;
        if (LIKELY(end - h->sent <= ring_mask)) {
            *in_ring = 1;
            return &ring[end & ring_mask];
        }
    }
    *in_ring = 0;
    return overflow_slot();
}

/* A ring record counts once it is whole: ring_end moves past it after its fields are written. */
static inline void commit(int in_ring) {
    if (in_ring) __atomic_store_n(&ring_head->ring_end, ring_head->ring_end + 1, __ATOMIC_RELEASE);
}

static inline int append_id(uint32_t site, int64_t t0, int64_t t1, uint64_t tid, int status,
                            int clock, int64_t in_bytes, int64_t out_bytes) {
    int in_ring;
    Record *r = next_record(&in_ring);
    if (UNLIKELY(r == NULL)) return -1;
    r->t0 = t0;
    r->t1 = t1;
    r->tid = tid;
    r->in_bytes = in_bytes;
    r->out_bytes = out_bytes;
    r->site = site;
    r->status = (uint8_t)status;
    r->clock = (uint8_t)clock;
    commit(in_ring);
    return 0;
}

/* The first and the newest anchor in the ring's header too: the runner converts a dead
 * process's ticks along the line through them. The newest is written to the slot not in use,
 * then named: a death in between leaves the previous one. */
static void anchor_to_ring(void) {
    RingHeader *h = ring_head;
    if (!h || n_anchors == 0) return;
    uint32_t next = (h->anchor_newest + 1) & 1;
    h->first_anchor = first_anchor;
    h->anchors[next] = anchors[newest_anchor];
    __atomic_store_n(&h->anchor_newest, next, __ATOMIC_RELEASE);
    h->n_anchors = 1;
}

static int append(PyObject *site, int64_t t0, int64_t t1, uint64_t tid, int status,
                  int64_t in_bytes, int64_t out_bytes) {
    uint32_t id;
    if (site_id(site, &id) < 0) return -1;
    return append_id(id, t0, t1, tid, status, CLOCK_NS, in_bytes, out_bytes);
}

/* python: before(site, fn, args, kwargs) -> (args, kwargs, state), or None: call it plainly */
static PyObject *before_call = NULL;
/* python: after(site, fn, args, kwargs, result, raised, t0, t1, state); never raises */
static PyObject *after_call = NULL;
static PyObject *sync_call = NULL;   /* python: wait for the GPU (FECOMLITE_SYNC), or NULL */
static PyObject *decide_call = NULL; /* python: decide(fn) -> True for a framework callee */
static PyObject *decisions = NULL;   /* dcall sites: site -> (callee key, True | False) */

/* The calls in progress, per thread, for the live view (`open_calls`): a fixed table of thread
 * slots, each a short stack of (site id, start stamp). A call pushes before it runs and pops
 * when it returns, with the GIL held; the flusher reads the table between calls. A thread takes a
 * slot at its first call and keeps it (no search per call); once every slot is taken, a new
 * thread takes over one whose thread is in no call now (a thread that ended, or is between
 * calls: the next call of that one sees the slot is no longer its own and takes another). So
 * threads that come and go never hold memory. Calls past OPEN_DEPTH on one thread, or on more
 * than OPEN_SLOTS threads in calls at once, are not shown (the first only counted in depth). */
#define OPEN_SLOTS 64
#define OPEN_DEPTH 8
typedef struct {
    int64_t t0;
    uint32_t site;
    uint8_t clock;
} OpenCall;

typedef struct {
    uint64_t tid;  /* 0: free */
    Py_ssize_t depth;
    OpenCall calls[OPEN_DEPTH];
} OpenSlot;

static OpenSlot open_slots[OPEN_SLOTS];

/* This thread's id (PyThread_get_thread_ident(), read once per thread; a fork keeps the forking
 * thread's) and the slot it took, in one thread-local block (initial-exec: one address). */
typedef struct {
    uint64_t tid;
    OpenSlot *slot;
} ThisThread;
static __thread ThisThread current __attribute__((tls_model("initial-exec")));

static inline uint64_t this_thread(void) {
    if (UNLIKELY(!current.tid)) current.tid = PyThread_get_thread_ident();
    return current.tid;
}

static OpenSlot *take_slot(uint64_t tid) {
    size_t h = (size_t)((tid * 0x9E3779B97F4A7C15ULL) >> 58); /* 6 bits: OPEN_SLOTS */
    OpenSlot *idle = NULL;
    for (size_t k = 0; k < OPEN_SLOTS; k++) {
        OpenSlot *s = &open_slots[(h + k) & (OPEN_SLOTS - 1)];
        if (s->tid == 0) {
            idle = s;
            break;
        }
        if (!idle && s->depth <= 0) idle = s;
    }
    if (!idle) return NULL; /* every slot's thread is in a call: this call is not shown */
    idle->depth = 0;
    idle->tid = tid;
    current.slot = idle;
    return idle;
}

/* This thread's slot, taken at its first call (NULL: none to be had). */
static inline OpenSlot *own_slot(uint64_t tid) {
    OpenSlot *s = current.slot;
    return LIKELY(s != NULL && s->tid == tid) ? s : take_slot(tid);
}

static inline void open_push(uint64_t tid, uint32_t site, int64_t t0, int clock) {
    OpenSlot *s = own_slot(tid);
    if (UNLIKELY(s == NULL)) return;
    Py_ssize_t depth = s->depth;
    if (LIKELY(depth < OPEN_DEPTH)) {
        OpenCall *c = &s->calls[depth];
        c->t0 = t0;
        c->site = site;
        c->clock = (uint8_t)clock;
    }
    s->depth = depth + 1;
}

/* Pops this call; a call that ends out of order (a greenlet switched stacks) is taken out from
 * where it is. */
static inline void open_pop(uint64_t tid, uint32_t site, int64_t t0) {
    OpenSlot *s = current.slot;
    if (UNLIKELY(s == NULL || s->tid != tid || s->depth <= 0)) return;
    Py_ssize_t top = s->depth - 1;
    if (UNLIKELY(top < OPEN_DEPTH && (s->calls[top].t0 != t0 || s->calls[top].site != site))) {
        Py_ssize_t i = top;
        while (i >= 0 && !(s->calls[i].t0 == t0 && s->calls[i].site == site)) i--;
        if (i < 0) return; /* not among this thread's calls */
        memmove(s->calls + i, s->calls + i + 1, (size_t)(top - i) * sizeof(OpenCall));
    }
    s->depth = top;
}

/* The GPU wait around a call (FECOMLITE_SYNC); a failing wait is the probe's, never the user's:
 * an exception in flight is kept as it was. */
static void gpu_wait(void) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *done = PyObject_CallNoArgs(sync_call);
    if (done) Py_DECREF(done); else PyErr_Clear();
    PyErr_Restore(type, value, tb);
}

static inline void gpu_sync(void) {
    if (UNLIKELY(sync_call != NULL)) gpu_wait();
}

/* fn(*args) timed: the fast path. */
static inline __attribute__((always_inline)) PyObject *
timed_call(uint32_t site, PyObject *fn, PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames,
           uint64_t tid) {
    gpu_sync();
    int clock = stamp_clock;
    int64_t t0 = stamp_on(clock);
    open_push(tid, site, t0, clock);
    PyObject *result = PyObject_Vectorcall(fn, args, nargs, kwnames);
    gpu_sync();
    int64_t t1 = stamp_on(clock);
    open_pop(tid, site, t0);
    if (UNLIKELY(append_id(site, t0, t1, tid, result == NULL, clock, -1, -1) < 0)) {
        /* out of memory: the event is lost, the user's result is not */
        if (result) PyErr_Clear(); else return NULL;
    }
    return result;
}

static PyObject *as_tuple(PyObject *const *args, Py_ssize_t nargs) {
    PyObject *tuple = PyTuple_New(nargs);
    for (Py_ssize_t i = 0; tuple && i < nargs; i++) PyTuple_SET_ITEM(tuple, i, Py_NewRef(args[i]));
    return tuple;
}

static PyObject *as_kwargs(PyObject *const *args, Py_ssize_t nargs, PyObject *kwnames) {
    PyObject *kwargs = PyDict_New();
    if (!kwargs || !kwnames) return kwargs;
    for (Py_ssize_t i = 0; i < PyTuple_GET_SIZE(kwnames); i++) {
        if (PyDict_SetItem(kwargs, PyTuple_GET_ITEM(kwnames, i), args[nargs + i]) < 0) {
            Py_DECREF(kwargs);
            return NULL;
        }
    }
    return kwargs;
}

/* after(...) with the call's outcome; whatever it does, the user's result or exception stands. */
static void call_after(PyObject *site, PyObject *fn, PyObject *prepared, PyObject *result,
                       int64_t t0, int64_t t1) {
    PyObject *type, *value, *tb;
    PyErr_Fetch(&type, &value, &tb);
    PyObject *t0o = PyLong_FromLongLong(t0), *t1o = PyLong_FromLongLong(t1);
    PyObject *done = NULL;
    if (t0o && t1o)
        done = PyObject_CallFunctionObjArgs(
            after_call, site, fn, PyTuple_GET_ITEM(prepared, 0), PyTuple_GET_ITEM(prepared, 1),
            result ? result : Py_None, result ? Py_False : Py_True, t0o, t1o,
            PyTuple_GET_ITEM(prepared, 2), NULL);
    if (done) Py_DECREF(done); else PyErr_Clear();
    Py_XDECREF(t0o);
    Py_XDECREF(t1o);
    PyErr_Restore(type, value, tb);
}

/* The sized path: before(), then fn called from here (no Python frame of the probe in between),
 * then after(). before() answering None (a tracer's call), or failing, leaves the fast path. */
static PyObject *sized_call(PyObject *site, uint32_t id, PyObject *fn, PyObject *const *args,
                            Py_ssize_t nargs, PyObject *kwnames, uint64_t tid) {
    PyObject *tuple = as_tuple(args, nargs);
    PyObject *kwargs = tuple ? as_kwargs(args, nargs, kwnames) : NULL;
    PyObject *prepared = NULL;
    if (kwargs)
        prepared = PyObject_CallFunctionObjArgs(before_call, site, fn, tuple, kwargs, NULL);
    Py_XDECREF(tuple);
    Py_XDECREF(kwargs);
    if (!prepared) PyErr_Clear();
    if (!prepared || !PyTuple_CheckExact(prepared) || PyTuple_GET_SIZE(prepared) != 3 ||
        !PyTuple_CheckExact(PyTuple_GET_ITEM(prepared, 0)) ||
        !PyDict_CheckExact(PyTuple_GET_ITEM(prepared, 1))) {
        Py_XDECREF(prepared);
        return timed_call(id, fn, args, nargs, kwnames, tid);
    }
    /* after() records the event with CLOCK_MONOTONIC stamps (it may stamp the end again) */
    int open_clock = stamp_clock;
    int64_t open_t0 = stamp_on(open_clock);
    int64_t t0 = now_ns();
    open_push(tid, id, open_t0, open_clock);
    PyObject *result = PyObject_Call(fn, PyTuple_GET_ITEM(prepared, 0),
                                     PyTuple_GET_ITEM(prepared, 1));
    int64_t t1 = now_ns();
    open_pop(tid, id, open_t0);
    call_after(site, fn, prepared, result, t0, t1);
    Py_DECREF(prepared);
    return result;
}

static inline __attribute__((always_inline)) PyObject *
probe_call_at(PyObject *site, PyObject *fn, PyObject *const *args, Py_ssize_t nargs,
              PyObject *kwnames) {
    uint64_t tid = this_thread();
    uint32_t id;
    if (UNLIKELY(site_id(site, &id) < 0)) { /* no event (out of memory, an unhashable site) */
        PyErr_Clear();
        return PyObject_Vectorcall(fn, args, nargs, kwnames);
    }
    if (UNLIKELY(!(site_flags[id] & SITE_FAST)) && before_call && after_call)
        return sized_call(site, id, fn, args, nargs, kwnames, tid);
    return timed_call(id, fn, args, nargs, kwnames, tid);
}

/* call(site, fn, /, *args, **kwargs) -> fn(*args, **kwargs), timed. */
static PyObject *probe_call(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                            PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (UNLIKELY(nargs < 2)) {
        PyErr_SetString(PyExc_TypeError, "call(site, fn, /, *args, **kwargs)");
        return NULL;
    }
    return probe_call_at(args[0], args[1], args + 2, nargs - 2, kwnames);
}

/* What a dcall site's decision holds for: the function itself (a plain or bound method's
 * function, a class), the receiver's type for a C method, else the callable object's type. A
 * borrowed reference. */
static PyObject *callee_key(PyObject *fn) {
    if (PyMethod_Check(fn)) return PyMethod_GET_FUNCTION(fn);
    if (PyCFunction_Check(fn)) {
        PyObject *owner = PyCFunction_GET_SELF(fn);
        return owner && !PyModule_Check(owner) ? (PyObject *)Py_TYPE(owner) : fn;
    }
    if (PyFunction_Check(fn) || PyType_Check(fn)) return fn;
    return (PyObject *)Py_TYPE(fn);
}

/* A direct-mapped cache in front of `decisions`, by the site object's address (a site key is
 * a constant of the user's code: one object per site): a hit is two compares. A slot holds
 * references to its site and key, so neither address can be reused while it is cached. */
#define DCACHE_SLOTS 4096
typedef struct {
    PyObject *site, *key;
    int yes;
} DecisionSlot;
static DecisionSlot dcache[DCACHE_SLOTS];

static inline DecisionSlot *dslot(PyObject *site) {
    return &dcache[((uintptr_t)site >> 4) & (DCACHE_SLOTS - 1)];
}

static void dcache_put(PyObject *site, PyObject *key, int yes) {
    DecisionSlot *slot = dslot(site);
    Py_INCREF(site);
    Py_INCREF(key);
    Py_XSETREF(slot->site, site);
    Py_XSETREF(slot->key, key);
    slot->yes = yes;
}

static void dcache_clear(void) {
    for (size_t i = 0; i < DCACHE_SLOTS; i++) {
        Py_CLEAR(dcache[i].site);
        Py_CLEAR(dcache[i].key);
    }
}

/* Whether fn is a framework API (decide(fn)), remembered for the site; a failure is "no". */
static int decided(PyObject *site, PyObject *fn, PyObject *key) {
    DecisionSlot *slot = dslot(site);
    if (slot->site == site && slot->key == key) return slot->yes;
    PyObject *entry = PyDict_GetItemWithError(decisions, site);
    if (entry && PyTuple_GET_ITEM(entry, 0) == key) {
        int yes = PyTuple_GET_ITEM(entry, 1) == Py_True;
        dcache_put(site, key, yes);
        return yes;
    }
    PyErr_Clear();
    PyObject *answer = decide_call ? PyObject_CallOneArg(decide_call, fn) : NULL;
    int yes = answer ? PyObject_IsTrue(answer) == 1 : 0;
    Py_XDECREF(answer);
    PyErr_Clear();
    PyObject *fresh = PyTuple_Pack(2, key, yes ? Py_True : Py_False);
    if (!fresh || PyDict_SetItem(decisions, site, fresh) < 0) PyErr_Clear();
    Py_XDECREF(fresh);
    dcache_put(site, key, yes);
    return yes;
}

/* dcall(site, fn, /, *args, **kwargs): `call` for a framework callee, else fn(*args) as is. */
static PyObject *probe_dcall(PyObject *self, PyObject *const *args, Py_ssize_t nargsf,
                             PyObject *kwnames) {
    Py_ssize_t nargs = PyVectorcall_NARGS(nargsf);
    if (nargs < 2) {
        PyErr_SetString(PyExc_TypeError, "dcall(site, fn, /, *args, **kwargs)");
        return NULL;
    }
    PyObject *site = args[0], *fn = args[1];
    if (decisions && decided(site, fn, callee_key(fn)))
        return probe_call_at(site, fn, args + 2, nargs - 2, kwnames);
    return PyObject_Vectorcall(fn, args + 2, nargs - 2, kwnames);
}

/* forget_decisions(): look at every dcall site's callee again (tests force the first call). */
static PyObject *probe_forget_decisions(PyObject *self, PyObject *unused) {
    if (decisions) PyDict_Clear(decisions);
    dcache_clear();
    Py_RETURN_NONE;
}

/* record(site, t0, t1, status=0, in_bytes=-1, out_bytes=-1, tid=0): tid 0 is this thread; another
   names the thread the span belongs to (a backward span run on autograd's device thread) */
static PyObject *probe_record(PyObject *self, PyObject *args, PyObject *kwargs) {
    static char *kwlist[] = {"site", "t0", "t1", "status", "in_bytes", "out_bytes", "tid", NULL};
    PyObject *site;
    long long t0, t1, in_bytes = -1, out_bytes = -1;
    unsigned long long tid = 0;
    int status = 0;
    if (!PyArg_ParseTupleAndKeywords(args, kwargs, "OLL|iLLK", kwlist, &site, &t0, &t1, &status,
                                     &in_bytes, &out_bytes, &tid))
        return NULL;
    if (tid == 0) tid = PyThread_get_thread_ident();
    if (append(site, t0, t1, (uint64_t)tid, status, in_bytes, out_bytes) < 0) return NULL;
    Py_RETURN_NONE;
}

/* drain() -> (site_names, site_index int32, t0, t1, tid, status, in_bytes, out_bytes) as bytes,
 * the stamps in CLOCK_MONOTONIC ns; a site's index is its place in site_names (first seen first) */
static inline uint64_t ring_records(void) {
    return ring_head ? __atomic_load_n(&ring_head->ring_end, __ATOMIC_ACQUIRE) - drained : 0;
}

static PyObject *probe_drain(PyObject *self, PyObject *unused) {
    uint64_t from_ring = ring_records();
    Py_ssize_t n = (Py_ssize_t)from_ring + n_records;
    PyObject *names = PyList_New(0), *out = NULL;
    PyObject *col[7] = {NULL};
    static const Py_ssize_t width[7] = {4, 8, 8, 8, 1, 8, 8};
    int32_t *index = PyMem_Malloc(((size_t)n_sites + 1) * sizeof(int32_t));
    if (!names || !index) goto done;
    for (int c = 0; c < 7; c++)
        if (!(col[c] = PyBytes_FromStringAndSize(NULL, n * width[c]))) goto done;
    memset(index, 0xff, ((size_t)n_sites + 1) * sizeof(int32_t));
    if (stamp_clock == CLOCK_TICKS || n_anchors) push_anchor();
    Segment segment = newest_segment();
    int32_t *site = (int32_t *)PyBytes_AS_STRING(col[0]);
    int64_t *t0 = (int64_t *)PyBytes_AS_STRING(col[1]), *t1 = (int64_t *)PyBytes_AS_STRING(col[2]);
    uint64_t *tid = (uint64_t *)PyBytes_AS_STRING(col[3]);
    uint8_t *status = (uint8_t *)PyBytes_AS_STRING(col[4]);
    int64_t *in = (int64_t *)PyBytes_AS_STRING(col[5]), *outb = (int64_t *)PyBytes_AS_STRING(col[6]);
    for (Py_ssize_t i = 0; i < n; i++) {
        const Record *r = (uint64_t)i < from_ring ? &ring[(drained + (uint64_t)i) & ring_mask]
                                                  : &records[i - (Py_ssize_t)from_ring];
        if (index[r->site] < 0) {
            index[r->site] = (int32_t)PyList_GET_SIZE(names);
            if (PyList_Append(names, site_names[r->site]) < 0) goto done;
        }
        site[i] = index[r->site];
        t0[i] = segment_ns(&segment, r->t0, r->clock);
        t1[i] = segment_ns(&segment, r->t1, r->clock);
        tid[i] = r->tid;
        status[i] = r->status;
        in[i] = r->in_bytes;
        outb[i] = r->out_bytes;
    }
    out = PyTuple_Pack(8, names, col[0], col[1], col[2], col[3], col[4], col[5], col[6]);
    if (out) {
        n_records = 0;
        drained += from_ring;
        drain_end = drained;
    }
done:
    PyMem_Free(index);
    Py_XDECREF(names);
    for (int c = 0; c < 7; c++) Py_XDECREF(col[c]);
    return out;
}

/* sending(seq): the batch drained last goes out as `seq` (a dead process's records from there
 * on are recovered under this id: the store keeps an id once, so none is stored twice) */
static PyObject *probe_sending(PyObject *self, PyObject *arg) {
    long long seq = PyLong_AsLongLong(arg);
    if (seq == -1 && PyErr_Occurred()) return NULL;
    if (ring_head) {
        ring_head->seq = seq;
        __atomic_store_n(&ring_head->batch_end, drain_end, __ATOMIC_RELEASE);
    }
    Py_RETURN_NONE;
}

/* sent(): the batch drained last was posted, spooled, or counted lost: its ring records go */
static PyObject *probe_sent(PyObject *self, PyObject *unused) {
    if (ring_head) __atomic_store_n(&ring_head->sent, drain_end, __ATOMIC_RELEASE);
    Py_RETURN_NONE;
}

static PyObject *probe_discard(PyObject *self, PyObject *unused) {
    n_records = 0;
    drained += ring_records();
    Py_RETURN_NONE;
}

/* open_calls() -> [(tid, depth, [(site, t0 ns), ...] outermost first)] for every thread in a call */
static PyObject *probe_open_calls(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    if (!out) return NULL;
    if (stamp_clock == CLOCK_TICKS || n_anchors) push_anchor();
    for (size_t k = 0; k < OPEN_SLOTS; k++) {
        OpenSlot *s = &open_slots[k];
        if (s->tid == 0 || s->depth <= 0) continue;
        Py_ssize_t shown = s->depth < OPEN_DEPTH ? s->depth : OPEN_DEPTH;
        PyObject *stack = PyList_New(shown);
        if (!stack) goto fail;
        for (Py_ssize_t i = 0; i < shown; i++) {
            const OpenCall *c = &s->calls[i];
            PyObject *item = Py_BuildValue("(OL)", site_names[c->site],
                                           (long long)stamp_ns(c->t0, c->clock));
            if (!item) { Py_DECREF(stack); goto fail; }
            PyList_SET_ITEM(stack, i, item);
        }
        PyObject *entry = Py_BuildValue("(KnN)", (unsigned long long)s->tid, s->depth, stack);
        if (!entry || PyList_Append(out, entry) < 0) { Py_XDECREF(entry); goto fail; }
        Py_DECREF(entry);
    }
    return out;
fail:
    Py_DECREF(out);
    return NULL;
}

/* forget_open(): a forked child runs none of its parent's calls (its threads are gone, and the
 * forking thread's calls, like a worker's, usually never return there). */
static PyObject *probe_forget_open(PyObject *self, PyObject *unused) {
    memset(open_slots, 0, sizeof(open_slots)); /* every thread takes a slot again */
    Py_RETURN_NONE;
}

/* pending() -> records not drained yet; the flusher asks every 50 ms, which keeps the anchors
 * (and the ring's, for a dead process's ticks) fresh between drains */
static PyObject *probe_pending(PyObject *self, PyObject *unused) {
    if (stamp_clock == CLOCK_TICKS && now_ns() - anchors[newest_anchor].ns >= ANCHOR_MERGE_NS)
        push_anchor();
    return PyLong_FromSsize_t((Py_ssize_t)ring_records() + n_records);
}


/* set_fast(site, fast): whether the site is past its sized calls (probe.py's `_fast`); a site
 * not seen yet is given an id only to be made fast */
static PyObject *probe_set_fast(PyObject *self, PyObject *args) {
    PyObject *site;
    int fast, known;
    uint32_t id;
    if (!PyArg_ParseTuple(args, "Op", &site, &fast)) return NULL;
    if (fast) {
        if (site_id(site, &id) < 0) return NULL;
        site_flags[id] |= SITE_FAST;
    } else {
        if ((known = known_site_id(site, &id)) < 0) return NULL;
        if (known) site_flags[id] &= ~SITE_FAST;
    }
    Py_RETURN_NONE;
}

/* is_fast(site) -> whether the site is past its sized calls */
static PyObject *probe_is_fast(PyObject *self, PyObject *site) {
    uint32_t id;
    int known = known_site_id(site, &id);
    if (known < 0) return NULL;
    return PyBool_FromLong(known && (site_flags[id] & SITE_FAST));
}

/* fast_sites() -> [site, ...] past their sized calls, in the order first seen */
static PyObject *probe_fast_sites(PyObject *self, PyObject *unused) {
    PyObject *out = PyList_New(0);
    for (uint32_t i = 0; out && i < n_sites; i++) {
        if ((site_flags[i] & SITE_FAST) && PyList_Append(out, site_names[i]) < 0) Py_CLEAR(out);
    }
    return out;
}

/* clear_fast(): every site takes its sized calls again (a resample) */
static PyObject *probe_clear_fast(PyObject *self, PyObject *unused) {
    for (uint32_t i = 0; i < n_sites; i++) site_flags[i] &= ~SITE_FAST;
    Py_RETURN_NONE;
}

/* use_tsc(on) -> whether the fast path now stamps with the TSC (False where there is none) */
static PyObject *probe_use_tsc(PyObject *self, PyObject *arg) {
    int on = PyObject_IsTrue(arg);
    if (on < 0) return NULL;
    stamp_clock = on && HAVE_TSC ? CLOCK_TICKS : CLOCK_NS;
    if (stamp_clock == CLOCK_TICKS && n_anchors == 0) push_anchor();
    first_rate();
    return PyBool_FromLong(stamp_clock == CLOCK_TICKS);
}

/* clock() -> "tsc" or "monotonic": what the fast path stamps with */
static PyObject *probe_clock(PyObject *self, PyObject *unused) {
    return PyUnicode_FromString(stamp_clock == CLOCK_TICKS ? "tsc" : "monotonic");
}

/* stamp() -> a raw stamp of the active clock; stamp_ns(stamp) -> it in CLOCK_MONOTONIC ns, as
 * drain() converts it now (tests check the conversion against clock_gettime) */
static PyObject *probe_stamp(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(stamp());
}

static PyObject *probe_stamp_ns(PyObject *self, PyObject *arg) {
    long long value = PyLong_AsLongLong(arg);
    if (value == -1 && PyErr_Occurred()) return NULL;
    if (stamp_clock == CLOCK_TICKS) push_anchor();
    return PyLong_FromLongLong(stamp_ns(value, stamp_clock));
}

/* configure(before, after, sync=None, decide=None) */
static PyObject *probe_configure(PyObject *self, PyObject *args) {
    PyObject *before, *after, *sync = Py_None, *decide = Py_None;
    if (!PyArg_ParseTuple(args, "OO|OO", &before, &after, &sync, &decide)) return NULL;
    if (!decisions && !(decisions = PyDict_New())) return NULL;
    Py_XSETREF(before_call, Py_NewRef(before));
    Py_XSETREF(after_call, Py_NewRef(after));
    Py_XSETREF(sync_call, sync == Py_None ? NULL : Py_NewRef(sync));
    Py_XSETREF(decide_call, decide == Py_None ? NULL : Py_NewRef(decide));
    PyDict_Clear(decisions);
    dcache_clear();
    Py_RETURN_NONE;
}

/* The ring's records not drained yet, moved in front of the overflow (nothing is lost when a
 * ring is let go). */
static int ring_to_memory(void) {
    Py_ssize_t moved = (Py_ssize_t)ring_records();
    if (moved == 0) return 0;
    while (records_cap < n_records + moved)
        if (grow() < 0) return -1;
    memmove(records + moved, records, (size_t)n_records * sizeof(Record));
    for (Py_ssize_t i = 0; i < moved; i++) records[i] = ring[(drained + (uint64_t)i) & ring_mask];
    n_records += moved;
    drained += (uint64_t)moved;
    return 0;
}

static void ring_release(void) {
    ring_head = NULL;
    ring = NULL;
    ring_mask = 0;
    sites_fd = -1;
    if (ring_held) PyBuffer_Release(&ring_view);
    ring_held = 0;
}

/* set_ring(buffer, sites_fd) or set_ring(None): records (and their count) go to the ring laid
 * out in a writable buffer (an mmap of the run's ring file, header written by event_ring.py),
 * each new site's key to the file sites_fd, after every site known so far. */
static PyObject *probe_set_ring(PyObject *self, PyObject *args) {
    PyObject *target;
    int fd = -1;
    if (!PyArg_ParseTuple(args, "O|i", &target, &fd)) return NULL;
    Py_buffer view;
    if (target != Py_None) {
        if (PyObject_GetBuffer(target, &view, PyBUF_WRITABLE) < 0) return NULL;
        RingHeader *h = (RingHeader *)view.buf;
        if (view.len < RING_HEADER_SIZE || ((uintptr_t)view.buf & 7) ||
            h->record_size != sizeof(Record) || h->capacity == 0 ||
            (h->capacity & (h->capacity - 1)) ||
            view.len < RING_HEADER_SIZE + (Py_ssize_t)h->capacity * (Py_ssize_t)sizeof(Record)) {
            PyBuffer_Release(&view);
            PyErr_SetString(PyExc_ValueError, "not a ring laid out for this probe");
            return NULL;
        }
    }
    if (ring_to_memory() < 0) {
        if (target != Py_None) PyBuffer_Release(&view);
        return NULL;
    }
    ring_release();
    if (target == Py_None) Py_RETURN_NONE;
    sites_fd = fd;
    for (uint32_t i = 0; i < n_sites; i++) site_to_file(site_names[i]);
    if (PyErr_Occurred()) PyErr_Clear();
    ring_view = view;
    ring_held = 1;
    ring_head = (RingHeader *)view.buf;
    ring = (Record *)((char *)view.buf + RING_HEADER_SIZE);
    ring_mask = ring_head->capacity - 1;
    drained = drain_end = ring_head->ring_end;
    anchor_to_ring();
    first_rate();
    Py_RETURN_NONE;
}

/* A ring on the tick clock gets a second anchor 1 ms after the first at once: the runner then has
 * a rate to convert the ticks of a process that dies before the flusher reads anchors (50 ms). */
static void first_rate(void) {
    if (stamp_clock != CLOCK_TICKS || !ring_head || n_anchors != 1) return;
    while (now_ns() - first_anchor.ns < 1000000) continue;
    push_anchor();
}

/* A forked child writes nothing into its parent's ring (the mapping is shared) until it has its
 * own; its parent's unsent records are its parent's. */
static void ring_forget_in_child(void) {
    ring_head = NULL;
    ring = NULL;
    ring_mask = 0;
    sites_fd = -1;
    drained = drain_end = 0;
}

static PyObject *probe_now(PyObject *self, PyObject *unused) {
    return PyLong_FromLongLong(now_ns());
}


/* Region: `with region:` of the user's own code (fecomlite/runtime/regions.py subclasses it). Entering
 * pushes (thread, now) on the object's own stack; leaving pops this thread's latest start and
 * appends the span like a call, so a region costs about a probe instead of a Python
 * enter/exit pair and a Python record (~1.3 µs). One object may be entered recursively and from
 * several threads: each exit takes the latest start of its own thread. */
typedef struct {
    PyObject_HEAD
    PyObject *site;
    int64_t *start;
    uint64_t *start_tid;
    Py_ssize_t depth, cap;
} Region;

static int region_init(Region *self, PyObject *args, PyObject *kwds) {
    PyObject *site;
    if (!PyArg_ParseTuple(args, "U", &site)) return -1;
    Py_INCREF(site);
    Py_XSETREF(self->site, site);
    return 0;
}

static void region_dealloc(Region *self) {
    Py_XDECREF(self->site);
    PyMem_Free(self->start);
    PyMem_Free(self->start_tid);
    Py_TYPE(self)->tp_free((PyObject *)self);
}

static PyObject *region_enter(Region *self, PyObject *unused) {
    if (self->depth == self->cap) {
        Py_ssize_t cap = self->cap ? self->cap * 2 : 8;
        int64_t *s = PyMem_Realloc(self->start, (size_t)cap * sizeof(int64_t));
        if (!s) return PyErr_NoMemory();
        self->start = s;
        uint64_t *t = PyMem_Realloc(self->start_tid, (size_t)cap * sizeof(uint64_t));
        if (!t) return PyErr_NoMemory();
        self->start_tid = t;
        self->cap = cap;
    }
    self->start_tid[self->depth] = PyThread_get_thread_ident();
    self->start[self->depth++] = now_ns();
    Py_INCREF(self);
    return (PyObject *)self;
}

static PyObject *region_exit(Region *self, PyObject *const *args, Py_ssize_t nargs) {
    int64_t t1 = now_ns();
    uint64_t tid = PyThread_get_thread_ident();
    Py_ssize_t i = self->depth - 1;
    while (i >= 0 && self->start_tid[i] != tid) i--;
    if (i < 0 || self->site == NULL) Py_RETURN_NONE; /* never entered on this thread */
    int64_t t0 = self->start[i];
    memmove(self->start + i, self->start + i + 1, (size_t)(self->depth - i - 1) * sizeof(int64_t));
    memmove(self->start_tid + i, self->start_tid + i + 1,
            (size_t)(self->depth - i - 1) * sizeof(uint64_t));
    self->depth--;
    int raised = nargs > 0 && args[0] != Py_None;
    if (append(self->site, t0, t1, tid, raised, -1, -1) < 0) PyErr_Clear(); /* lose the event */
    Py_RETURN_NONE;
}

static PyObject *region_get_site(Region *self, void *closure) {
    if (!self->site) Py_RETURN_NONE;
    Py_INCREF(self->site);
    return self->site;
}

static PyMethodDef region_methods[] = {
    {"__enter__", (PyCFunction)region_enter, METH_NOARGS, "Start the span."},
    {"__exit__", (PyCFunction)(void (*)(void))region_exit, METH_FASTCALL,
     "End this thread's latest span and record it."},
    {NULL, NULL, 0, NULL},
};

static PyGetSetDef region_getset[] = {
    {"site", (getter)region_get_site, NULL, "the site key the span is recorded under", NULL},
    {NULL, NULL, NULL, NULL, NULL},
};

static PyTypeObject RegionType = {
    PyVarObject_HEAD_INIT(NULL, 0)
    .tp_name = "fecomlite.runtime._fastprobe.Region",
    .tp_basicsize = sizeof(Region),
    .tp_flags = Py_TPFLAGS_DEFAULT | Py_TPFLAGS_BASETYPE,
    .tp_doc = "Region(site): a span of user code recorded like a call.",
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)region_init,
    .tp_dealloc = (destructor)region_dealloc,
    .tp_methods = region_methods,
    .tp_getset = region_getset,
};

static PyMethodDef methods[] = {
    {"call", (PyCFunction)(void (*)(void))probe_call, METH_FASTCALL | METH_KEYWORDS,
     "call(site, fn, /, *args, **kwargs): call fn and record when it ran."},
    {"dcall", (PyCFunction)(void (*)(void))probe_dcall, METH_FASTCALL | METH_KEYWORDS,
     "dcall(site, fn, /, *args, **kwargs): `call` when fn is a framework API (decided once per "
     "site and callee), else fn(*args, **kwargs) untouched."},
    {"forget_decisions", probe_forget_decisions, METH_NOARGS,
     "Decide every dcall site's callee again on its next call."},
    {"record", (PyCFunction)(void (*)(void))probe_record, METH_VARARGS | METH_KEYWORDS,
     "record(site, t0, t1, status=0, in_bytes=-1, out_bytes=-1, tid=0): append one event "
     "(tid 0: this thread's)."},
    {"drain", probe_drain, METH_NOARGS, "Take every buffered event as columns."},
    {"discard", probe_discard, METH_NOARGS, "Drop every buffered event (a forked child)."},
    {"pending", probe_pending, METH_NOARGS, "Number of buffered events."},
    {"open_calls", probe_open_calls, METH_NOARGS,
     "The calls in progress: [(tid, depth, [(site, t0_ns), ...] outermost first)]."},
    {"forget_open", probe_forget_open, METH_NOARGS, "Clear the calls in progress (a forked child)."},
    {"configure", probe_configure, METH_VARARGS,
     "configure(before, after, sync=None, decide=None): the sized path's helpers (for sites "
     "not set_fast), the GPU wait around every call, and dcall's judge."},
    {"set_fast", probe_set_fast, METH_VARARGS,
     "set_fast(site, fast): whether the site is past its sized calls (timestamps only)."},
    {"clear_fast", probe_clear_fast, METH_NOARGS, "Every site takes its sized calls again."},
    {"is_fast", probe_is_fast, METH_O, "is_fast(site): whether it is past its sized calls."},
    {"fast_sites", probe_fast_sites, METH_NOARGS, "The sites past their sized calls."},
    {"use_tsc", probe_use_tsc, METH_O,
     "use_tsc(on) -> whether the fast path now stamps with the TSC (invariant TSC only)."},
    {"clock", probe_clock, METH_NOARGS, "What the fast path stamps with: 'tsc' or 'monotonic'."},
    {"stamp", probe_stamp, METH_NOARGS, "A raw stamp of the fast path's clock."},
    {"stamp_ns", probe_stamp_ns, METH_O, "A raw stamp in CLOCK_MONOTONIC ns, as drain() has it."},
    {"set_ring", probe_set_ring, METH_VARARGS,
     "set_ring(buffer, sites_fd) or set_ring(None): keep records in a ring in shared memory "
     "(a mapped file) and new sites' keys in a file, so a dead process's are recovered."},
    {"sending", probe_sending, METH_O, "sending(seq): the batch drained last goes out as seq."},
    {"sent", probe_sent, METH_NOARGS, "The batch drained last was posted, spooled or lost."},
    {"now", probe_now, METH_NOARGS, "CLOCK_MONOTONIC in ns (time.monotonic_ns)."},
    {NULL, NULL, 0, NULL},
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_fastprobe", "The probe's hot path in C.", -1, methods,
};

PyMODINIT_FUNC PyInit__fastprobe(void) {
    if (PyType_Ready(&RegionType) < 0) return NULL;
    if (pthread_atfork(NULL, NULL, ring_forget_in_child) != 0) return PyErr_NoMemory();
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&RegionType);
    if (PyModule_AddObject(m, "Region", (PyObject *)&RegionType) < 0) {
        Py_DECREF(&RegionType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
