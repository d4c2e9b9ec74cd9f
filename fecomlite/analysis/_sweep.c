/* The streamed analysis' sweep over a run's calls in C: nesting per thread, and per call the
 * sums of sweep 1 (leaf time per sensor interval and fit group) or of sweep 2 (inclusive, self
 * and idle-share energy per domain, uncertainty, per-site and per-call moments), in one pass.
 *
 * Why C: the numpy sweep (fecomlite/analysis/streamed.py, sweep.py) spends ~2 us a call in
 * ~150 array operations a call, most of them on arrays of a batch; a day of training (~90 M
 * calls) then takes minutes to report. Here a call costs a few table lookups and adds.
 *
 * Calls come in start order (per thread, the outer call first at one instant: the caller sorts
 * ties by later end). Each thread keeps its records: the open calls in a heap by end (at one
 * end the deepest first, so children close before their parent), the latest call at each level.
 * A call's parent is the one `attribution.nesting` gives: its level is the calls of its thread
 * still open at its start (an end at a start is closed; a zero-length call stays open for calls
 * starting at its instant), its parent the latest call one level up, climbed through parents
 * until one contains it; for calls that nest (a call stack) that is the innermost open call,
 * and calls that overlap without nesting (a data loader's) nest as in the whole-run analysis.
 * A call closes when a later start on its thread comes after its end, or at `flush()`; closing
 * adds its inclusive sums to its parent's. Records no longer needed (closed, not the latest at
 * a level nor an ancestor of one) are dropped now and then (`compact`). Every array is the
 * caller's numpy array, read and written in place through the buffer protocol (no numpy
 * headers needed).
 */
#define PY_SSIZE_T_CLEAN
#include <Python.h>
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define NS 1e9
#define MAX_DOMAINS 16
#define RAISED 1
#define CONTINUES 2

typedef struct {
    int64_t t0, t1, endkey, site, grp, rep;
    int64_t parent; /* index in its thread's records, -1: none */
    int64_t depth;  /* of the nesting found (parent links) */
    int64_t level;  /* open calls of its thread when it started (`nesting`'s first depth) */
    int64_t open, mark;
} Head;

typedef struct { /* one thread: its records, the open ones in a heap by end, the latest call
                    at each level */
    char *data;
    Py_ssize_t len, cap, keep; /* keep: records when last compacted */
    int64_t *heap;
    Py_ssize_t hlen, hcap;
    int64_t *last; /* record index at each level, -1: none */
    Py_ssize_t nlast, lcap;
} Stack;

typedef struct {
    Py_buffer edges; /* int64 K + 1 */
    int64_t k;
    int64_t hint;
} Edges;

typedef struct { /* sweep 1: one sensor's intervals (the lead of those read at its instants) */
    int edges;
    Py_buffer flat, marks; /* float64 K x ncols, added in place */
    int64_t ncols;
} LeafPart;

typedef struct { /* sweep 2: one domain */
    int edges;
    int64_t g; /* columns of rates */
    Py_buffer rates, cum, q, cum_q, h, weights, above, lengths, meas;
    double period_s;
    /* per site: inclusive, total, self, sharing_abs, meas_sq, below, n, mean, m2; per_rep
     * (sites x reps); totals (in_calls_J, in_calls_total_J); rep_in_calls (reps) */
    Py_buffer out[12];
} EnergyPart;

enum { O_INC, O_TOTAL, O_SELF, O_SHARING, O_MEAS, O_BELOW, O_N, O_MEAN, O_M2, O_PER_REP,
       O_TOTALS, O_REP_IN };

typedef struct {
    PyObject_HEAD
    Py_buffer site_grp; /* int64 per site */
    int64_t n_sites, n_reps;
    int nedges, nleaf, nenergy;
    Edges e[MAX_DOMAINS];
    LeafPart leaf[MAX_DOMAINS];
    EnergyPart en[MAX_DOMAINS];
    Py_buffer counts[6]; /* calls, pieces, raised, time_s (per site), rep_calls (sites x reps),
                            rep_events (reps): float64 */
    int has_counts;
    Stack *stacks;
    Py_ssize_t nstacks;
    Py_ssize_t rec; /* bytes a record: Head + 2 doubles a domain */
} Sweep;

static int get(PyObject *o, Py_buffer *b, int writable, Py_ssize_t itemsize, Py_ssize_t n) {
    if (PyObject_GetBuffer(o, b, PyBUF_C_CONTIGUOUS | PyBUF_FORMAT |
                                     (writable ? PyBUF_WRITABLE : 0)) < 0)
        return -1;
    if (b->itemsize != itemsize || (n >= 0 && b->len / itemsize < n)) {
        PyErr_Format(PyExc_ValueError, "array of %zd-byte items, at least %zd, expected",
                     itemsize, n);
        PyBuffer_Release(b);
        b->obj = NULL;
        return -1;
    }
    return 0;
}

#define D(b) ((double *)(b).buf)
#define I(b) ((int64_t *)(b).buf)

/* first index with edges > x (hint: a guess of the answer - 1) */
static int64_t search_right(Edges *e, int64_t x, int64_t hint) {
    const int64_t *v = I(e->edges);
    int64_t n = e->k + 1;
    if (hint >= 0 && hint < n && v[hint] <= x && (hint + 1 == n || v[hint + 1] > x))
        return hint + 1;
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (v[mid] <= x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

/* first index with edges >= x (hint: a guess of the answer - 1) */
static int64_t search_left(Edges *e, int64_t x, int64_t hint) {
    const int64_t *v = I(e->edges);
    int64_t n = e->k + 1;
    if (hint >= 0 && hint < n && v[hint] < x && (hint + 1 == n || v[hint + 1] >= x))
        return hint + 1;
    int64_t lo = 0, hi = n;
    while (lo < hi) {
        int64_t mid = (lo + hi) / 2;
        if (v[mid] < x) lo = mid + 1; else hi = mid;
    }
    return lo;
}

static int64_t clip(Edges *e, int64_t t) {
    const int64_t *v = I(e->edges);
    return t < v[0] ? v[0] : (t > v[e->k] ? v[e->k] : t);
}

/* where an instant falls (`streamed._At`): interval i, seconds into it, the clipped instant */
typedef struct {
    int64_t i, tc, ir; /* ir: search_right - 1 before the last interval's cap */
    double dt;
} At;

static At at_of(Edges *e, int64_t t, int64_t hint) {
    At a;
    a.tc = clip(e, t);
    a.ir = search_right(e, a.tc, hint) - 1;
    a.i = a.ir < e->k - 1 ? a.ir : e->k - 1;
    a.dt = (double)(a.tc - I(e->edges)[a.i]) / NS;
    return a;
}

static void leaf_span(Sweep *s, LeafPart *p, int64_t a, int64_t b, int64_t col, double w) {
    Edges *e = &s->e[p->edges];
    const int64_t *v = I(e->edges);
    int64_t k = e->k, nc = p->ncols;
    a = clip(e, a);
    b = clip(e, b);
    if (b <= a) return;
    int64_t i = search_right(e, a, e->hint) - 1;
    if (i > k - 1) i = k - 1;
    int64_t j = search_left(e, b, i) - 1;
    if (j > k - 1) j = k - 1;
    double *flat = D(p->flat), *marks = D(p->marks);
    if (i == j) {
        flat[i * nc + col] += w * (double)(b - a) / NS;
        return;
    }
    flat[i * nc + col] += w * (double)(v[i + 1] - a) / NS;
    flat[j * nc + col] += w * (double)(b - v[j]) / NS;
    if (j > i + 1) {
        marks[(i + 1) * nc + col] += w;
        marks[j * nc + col] -= w;
    }
}

static Head *rec_at(Sweep *s, Stack *st, Py_ssize_t pos) {
    return (Head *)(st->data + pos * s->rec);
}

static double *acc_of(Head *h) { return (double *)(h + 1); } /* acc[d], then accq[d] */

static void welford(double *n, double *mean, double *m2, double x) {
    *n += 1;
    double delta = x - *mean;
    *mean += delta / *n;
    *m2 += delta * (x - *mean);
}

/* close a record: its inclusive sums are final (its children closed before it) */
static void close_rec(Sweep *s, Stack *st, Head *h) {
    double *acc = acc_of(h);
    /* a parent closed first can only come from calls that overlap without nesting, at one
     * instant: its sums are final, the child's go to the site sums only */
    Head *parent = h->parent >= 0 ? rec_at(s, st, h->parent) : NULL;
    if (parent && !parent->open) parent = NULL;
    h->open = 0;
    for (int d = 0; d < s->nenergy; d++) {
        EnergyPart *p = &s->en[d];
        double inc = acc[d], incq = acc[s->nenergy + d];
        int64_t site = h->site;
        if (parent) {
            acc_of(parent)[d] += inc;
            acc_of(parent)[s->nenergy + d] += incq;
        } else if (h->parent < 0) {
            D(p->out[O_TOTALS])[0] += inc;
            D(p->out[O_TOTALS])[1] += inc + incq;
            if (h->rep >= 0) D(p->out[O_REP_IN])[h->rep] += inc;
        }
        D(p->out[O_INC])[site] += inc;
        D(p->out[O_TOTAL])[site] += inc + incq;
        if (h->rep >= 0) D(p->out[O_PER_REP])[site * s->n_reps + h->rep] += inc;
        welford(&D(p->out[O_N])[site], &D(p->out[O_MEAN])[site], &D(p->out[O_M2])[site], inc);
    }
}

/* the heap of open records: the earliest end first, at one end the deepest (children close
 * before their parent), then the earliest started */
static int before(Sweep *s, Stack *st, int64_t a, int64_t b) {
    Head *x = rec_at(s, st, a), *y = rec_at(s, st, b);
    if (x->endkey != y->endkey) return x->endkey < y->endkey;
    if (x->depth != y->depth) return x->depth > y->depth;
    return a < b;
}

static void heap_down(Sweep *s, Stack *st, Py_ssize_t i) {
    int64_t *h = st->heap;
    for (;;) {
        Py_ssize_t l = 2 * i + 1, r = l + 1, m = i;
        if (l < st->hlen && before(s, st, h[l], h[m])) m = l;
        if (r < st->hlen && before(s, st, h[r], h[m])) m = r;
        if (m == i) return;
        int64_t t = h[i]; h[i] = h[m]; h[m] = t;
        i = m;
    }
}

static void heap_up(Sweep *s, Stack *st, Py_ssize_t i) {
    int64_t *h = st->heap;
    while (i > 0 && before(s, st, h[i], h[(i - 1) / 2])) {
        int64_t t = h[i]; h[i] = h[(i - 1) / 2]; h[(i - 1) / 2] = t;
        i = (i - 1) / 2;
    }
}

static void close_first(Sweep *s, Stack *st) {
    int64_t top = st->heap[0];
    st->heap[0] = st->heap[--st->hlen];
    heap_down(s, st, 0);
    close_rec(s, st, rec_at(s, st, top));
}

static int grow(void **p, Py_ssize_t *cap, Py_ssize_t need, Py_ssize_t size) {
    if (need <= *cap) return 0;
    Py_ssize_t n = *cap ? 2 * *cap : 64;
    while (n < need) n *= 2;
    void *more = PyMem_Realloc(*p, n * size);
    if (!more) { PyErr_NoMemory(); return -1; }
    *p = more;
    *cap = n;
    return 0;
}

/* keep the records still needed (open, latest at a level, and their ancestors), renumbered */
static int compact(Sweep *s, Stack *st) {
    int64_t *map = PyMem_Malloc((st->len + 1) * sizeof(int64_t));
    if (!map) { PyErr_NoMemory(); return -1; }
    for (Py_ssize_t i = 0; i < st->len; i++) rec_at(s, st, i)->mark = 0;
    for (Py_ssize_t i = 0; i < st->hlen + st->nlast; i++) {
        int64_t r = i < st->hlen ? st->heap[i] : st->last[i - st->hlen];
        while (r >= 0 && !rec_at(s, st, r)->mark) {
            rec_at(s, st, r)->mark = 1;
            r = rec_at(s, st, r)->parent;
        }
    }
    Py_ssize_t n = 0;
    for (Py_ssize_t i = 0; i < st->len; i++) {
        Head *h = rec_at(s, st, i);
        map[i] = h->mark ? n : -1;
        if (!h->mark) continue;
        if (n != i) memmove(rec_at(s, st, n), h, s->rec);
        n++;
    }
    for (Py_ssize_t i = 0; i < n; i++) {
        Head *h = rec_at(s, st, i);
        if (h->parent >= 0) h->parent = map[h->parent];
    }
    for (Py_ssize_t i = 0; i < st->hlen; i++) st->heap[i] = map[st->heap[i]];
    for (Py_ssize_t i = 0; i < st->nlast; i++)
        if (st->last[i] >= 0) st->last[i] = map[st->last[i]];
    st->len = st->keep = n;
    PyMem_Free(map);
    return 0;
}

/* the call's record on its thread: `nesting`'s parent (the latest call one level up, climbed
 * until it contains the call); calls that ended by its start are closed first */
static Head *push(Sweep *s, Stack *st, int64_t t0, int64_t t1) {
    while (st->hlen && rec_at(s, st, st->heap[0])->endkey <= 2 * t0) close_first(s, st);
    int64_t level = st->hlen;
    int64_t parent = level >= 1 && level - 1 < st->nlast ? st->last[level - 1] : -1;
    while (parent >= 0 && rec_at(s, st, parent)->t1 < t1) parent = rec_at(s, st, parent)->parent;
    if (st->len == st->cap && st->len > 2 * st->keep + 1024) {
        if (compact(s, st) < 0) return NULL;
        parent = -2; /* renumbered: found again below */
    }
    if (parent == -2) {
        parent = level >= 1 && level - 1 < st->nlast ? st->last[level - 1] : -1;
        while (parent >= 0 && rec_at(s, st, parent)->t1 < t1)
            parent = rec_at(s, st, parent)->parent;
    }
    if (grow((void **)&st->data, &st->cap, st->len + 1, s->rec) < 0
        || grow((void **)&st->heap, &st->hcap, st->hlen + 1, sizeof(int64_t)) < 0
        || grow((void **)&st->last, &st->lcap, level + 1, sizeof(int64_t)) < 0)
        return NULL;
    int64_t idx = st->len++;
    Head *h = rec_at(s, st, idx);
    h->t0 = t0;
    h->t1 = t1;
    h->endkey = 2 * t1 + (t1 == t0); /* a zero-length call ends after the starts at its instant */
    h->parent = parent;
    h->depth = parent >= 0 ? rec_at(s, st, parent)->depth + 1 : 0;
    h->level = level;
    h->open = 1;
    h->mark = 0;
    while (st->nlast <= level) st->last[st->nlast++] = -1;
    st->last[level] = idx;
    st->heap[st->hlen++] = idx;
    heap_up(s, st, st->hlen - 1);
    return h;
}

static void flush_stack(Sweep *s, Stack *st) {
    while (st->hlen) close_first(s, st);
    st->len = st->keep = st->nlast = 0;
}

static Stack *stack_of(Sweep *s, int64_t thread) {
    if (thread >= s->nstacks) {
        Py_ssize_t n = thread + 8;
        Stack *more = PyMem_Realloc(s->stacks, n * sizeof(Stack));
        if (!more) return NULL;
        memset(more + s->nstacks, 0, (n - s->nstacks) * sizeof(Stack));
        s->stacks = more;
        s->nstacks = n;
    }
    return &s->stacks[thread];
}

static void energy(Sweep *s, Head *h, Head *parent, At *a0, At *a1) {
    double *acc = acc_of(h);
    for (int d = 0; d < s->nenergy; d++) {
        EnergyPart *p = &s->en[d];
        Edges *e = &s->e[p->edges];
        At *x0 = &a0[p->edges], *x1 = &a1[p->edges];
        const double *rates = D(p->rates), *cum = D(p->cum), *q = D(p->q), *cq = D(p->cum_q);
        int64_t g = h->grp, G = p->g;
        double x = cum[x1->i * G + g] + rates[x1->i * G + g] * x1->dt
                   - (cum[x0->i * G + g] + rates[x0->i * G + g] * x0->dt);
        double xq = cq[x1->i] + q[x1->i] * x1->dt - (cq[x0->i] + q[x0->i] * x0->dt);
        acc[d] = x;
        acc[s->nenergy + d] = xq;
        double *self = D(p->out[O_SELF]);
        self[h->site] += x;
        if (parent) {
            int64_t gp = parent->grp;
            double term = cum[x1->i * G + gp] + rates[x1->i * G + gp] * x1->dt
                          - (cum[x0->i * G + gp] + rates[x0->i * G + gp] * x0->dt);
            acc_of(parent)[d] -= term;
            acc_of(parent)[s->nenergy + d] -= xq;
            self[parent->site] -= term;
        }
        /* `attribution._uncertainty`: the first and the last interval the call touches */
        const int64_t *v = I(e->edges);
        const double *len = D(p->lengths), *above = D(p->above), *hh = D(p->h),
                     *meas = D(p->meas);
        int64_t k = e->k, i = x0->i, tc0 = x0->tc, tc1 = x1->tc;
        int64_t jl = x1->ir;
        if (jl >= 0 && v[jl] == tc1) jl = search_left(e, tc1, jl - 1) - 1;
        int64_t j = jl < k - 1 ? jl : k - 1;
        if (j < i) j = i;
        double weight = D(p->weights)[g];
        int64_t first_hi = tc1 < v[i + 1] ? tc1 : v[i + 1];
        int64_t last_lo = j > i ? (tc0 > v[j] ? tc0 : v[j]) : tc1;
        double sharing = 0, measurement = 0;
        int64_t idx[2] = {i, j}, lo[2] = {tc0, last_lo}, hi[2] = {first_hi, tc1};
        for (int m = 0; m < 2; m++) {
            int64_t at = idx[m];
            double part = hi[m] > lo[m] ? (double)(hi[m] - lo[m]) / NS : 0.0;
            double en = weight * hh[at] * part;
            double filled = len[at] > 0 ? part / len[at] : 1.0;
            double share = above[at] != 0 ? en / above[at] : 0.0;
            sharing += (en * (1 - filled)) * (en * (1 - filled));
            measurement += (share * meas[at]) * (share * meas[at]);
        }
        D(p->out[O_SHARING])[h->site] += sqrt(sharing);
        double ms = sqrt(measurement);
        D(p->out[O_MEAS])[h->site] += ms * ms;
        D(p->out[O_BELOW])[h->site] += (double)(h->t1 - h->t0) / NS < p->period_s;
    }
}

static PyObject *Sweep_add(Sweep *s, PyObject *args) {
    PyObject *o[6];
    if (!PyArg_ParseTuple(args, "OOOOOO", &o[0], &o[1], &o[2], &o[3], &o[4], &o[5])) return NULL;
    Py_buffer b[6] = {{0}};
    Py_ssize_t n = -1;
    PyObject *result = NULL;
    for (int i = 0; i < 6; i++) {
        if (get(o[i], &b[i], 0, 8, n) < 0) goto done;
        if (n < 0) n = b[i].len / 8;
    }
    const int64_t *site = I(b[0]), *thread = I(b[1]), *rep = I(b[2]), *t0s = I(b[3]),
                  *t1s = I(b[4]), *status = I(b[5]);
    const int64_t *grp = I(s->site_grp);
    At a0[MAX_DOMAINS], a1[MAX_DOMAINS];
    for (Py_ssize_t c = 0; c < n; c++) {
        int64_t t0 = t0s[c], t1 = t1s[c] > t0 ? t1s[c] : t0;
        if (site[c] < 0 || site[c] >= s->n_sites || thread[c] < 0 || rep[c] >= s->n_reps) {
            PyErr_SetString(PyExc_ValueError, "site, thread or repetition out of range");
            goto done;
        }
        Stack *st = stack_of(s, thread[c]);
        if (!st) { PyErr_NoMemory(); goto done; }
        Head *h = push(s, st, t0, t1);
        if (!h) goto done;
        h->site = site[c];
        h->grp = grp[site[c]];
        h->rep = rep[c];
        Head *ph = h->parent >= 0 ? rec_at(s, st, h->parent) : NULL;
        if (ph && !ph->open) ph = NULL; /* see close_rec */
        if (s->has_counts) {
            int head = (status[c] & CONTINUES) == 0;
            D(s->counts[0])[h->site] += head;
            D(s->counts[1])[h->site] += 1;
            D(s->counts[2])[h->site] += (status[c] & RAISED) != 0;
            D(s->counts[3])[h->site] += (double)(t1 - t0) / NS;
            if (h->rep >= 0) {
                D(s->counts[5])[h->rep] += 1;
                if (head) D(s->counts[4])[h->site * s->n_reps + h->rep] += 1;
            }
        }
        for (int e = 0; e < s->nedges; e++) { /* starts come in order: the last one's
                                                  interval is the first guess */
            a0[e] = at_of(&s->e[e], t0, s->e[e].hint);
            s->e[e].hint = a0[e].ir;
            if (s->nenergy) a1[e] = at_of(&s->e[e], t1, a0[e].ir);
        }
        energy(s, h, ph, a0, a1);
        for (int l = 0; l < s->nleaf; l++) {
            leaf_span(s, &s->leaf[l], t0, t1, h->grp, 1.0);
            if (ph) leaf_span(s, &s->leaf[l], t0, t1, ph->grp, -1.0);
        }
    }
    result = Py_None;
    Py_INCREF(result);
done:
    for (int i = 0; i < 6; i++)
        if (b[i].obj) PyBuffer_Release(&b[i]);
    return result;
}

static PyObject *Sweep_flush(Sweep *s, PyObject *unused) {
    for (Py_ssize_t t = 0; t < s->nstacks; t++) flush_stack(s, &s->stacks[t]);
    Py_RETURN_NONE;
}

static PyObject *Sweep_open(Sweep *s, PyObject *unused) {
    Py_ssize_t n = 0;
    for (Py_ssize_t t = 0; t < s->nstacks; t++) n += s->stacks[t].hlen;
    return PyLong_FromSsize_t(n);
}

static void release_all(Sweep *s) {
    if (s->site_grp.obj) PyBuffer_Release(&s->site_grp);
    for (int i = 0; i < s->nedges; i++)
        if (s->e[i].edges.obj) PyBuffer_Release(&s->e[i].edges);
    for (int i = 0; i < s->nleaf; i++) {
        if (s->leaf[i].flat.obj) PyBuffer_Release(&s->leaf[i].flat);
        if (s->leaf[i].marks.obj) PyBuffer_Release(&s->leaf[i].marks);
    }
    for (int i = 0; i < s->nenergy; i++) {
        Py_buffer *bs[] = {&s->en[i].rates, &s->en[i].cum, &s->en[i].q, &s->en[i].cum_q,
                           &s->en[i].h, &s->en[i].weights, &s->en[i].above,
                           &s->en[i].lengths, &s->en[i].meas};
        for (int j = 0; j < 9; j++)
            if (bs[j]->obj) PyBuffer_Release(bs[j]);
        for (int j = 0; j < 12; j++)
            if (s->en[i].out[j].obj) PyBuffer_Release(&s->en[i].out[j]);
    }
    for (int i = 0; i < 6; i++)
        if (s->counts[i].obj) PyBuffer_Release(&s->counts[i]);
    for (Py_ssize_t t = 0; t < s->nstacks; t++) {
        PyMem_Free(s->stacks[t].data);
        PyMem_Free(s->stacks[t].heap);
        PyMem_Free(s->stacks[t].last);
    }
    PyMem_Free(s->stacks);
    s->stacks = NULL;
    s->nstacks = 0;
}

static void Sweep_dealloc(Sweep *s) {
    release_all(s);
    Py_TYPE(s)->tp_free((PyObject *)s);
}

/* Sweep(site_grp, n_reps, edges, leaf, energy, counts):
 *   edges: list of int64 arrays (the distinct sensors' edges);
 *   leaf: list of (edges index, flat, marks, ncols), sweep 1;
 *   energy: list of (edges index, ncols, rates, cum, q, cum_q, h, weights, above, lengths,
 *           meas, period_s, (12 output arrays)), sweep 2;
 *   counts: None or (calls, pieces, raised, time_s, rep_calls, rep_events). */
static int Sweep_init(Sweep *s, PyObject *args, PyObject *kw) {
    PyObject *grp, *edges, *leaf, *en, *counts;
    long long reps;
    release_all(s);
    memset(&s->site_grp, 0, sizeof(Sweep) - offsetof(Sweep, site_grp));
    if (!PyArg_ParseTuple(args, "OLO!O!O!O", &grp, &reps, &PyList_Type, &edges, &PyList_Type,
                          &leaf, &PyList_Type, &en, &counts))
        return -1;
    if (get(grp, &s->site_grp, 0, 8, -1) < 0) return -1;
    s->n_sites = s->site_grp.len / 8;
    s->n_reps = reps;
    if (PyList_GET_SIZE(edges) > MAX_DOMAINS || PyList_GET_SIZE(leaf) > MAX_DOMAINS
        || PyList_GET_SIZE(en) > MAX_DOMAINS) {
        PyErr_SetString(PyExc_ValueError, "too many domains");
        return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(edges); i++) {
        if (get(PyList_GET_ITEM(edges, i), &s->e[i].edges, 0, 8, 2) < 0) return -1;
        s->nedges = i + 1;
        s->e[i].k = s->e[i].edges.len / 8 - 1;
        s->e[i].hint = -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(leaf); i++) {
        LeafPart *p = &s->leaf[i];
        PyObject *fl, *mk;
        long long ncols;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(leaf, i), "iOOL", &p->edges, &fl, &mk, &ncols))
            return -1;
        s->nleaf = i + 1;
        if (p->edges < 0 || p->edges >= s->nedges) {
            PyErr_SetString(PyExc_ValueError, "no such edges");
            return -1;
        }
        p->ncols = ncols;
        Py_ssize_t size = s->e[p->edges].k * ncols;
        if (get(fl, &p->flat, 1, 8, size) < 0 || get(mk, &p->marks, 1, 8, size) < 0) return -1;
    }
    for (Py_ssize_t i = 0; i < PyList_GET_SIZE(en); i++) {
        EnergyPart *p = &s->en[i];
        PyObject *a[9], *outs;
        long long g;
        if (!PyArg_ParseTuple(PyList_GET_ITEM(en, i), "iLOOOOOOOOOdO!", &p->edges, &g, &a[0],
                              &a[1], &a[2], &a[3], &a[4], &a[5], &a[6], &a[7], &a[8],
                              &p->period_s, &PyTuple_Type, &outs))
            return -1;
        s->nenergy = i + 1;
        if (p->edges < 0 || p->edges >= s->nedges || PyTuple_GET_SIZE(outs) != 12) {
            PyErr_SetString(PyExc_ValueError, "bad energy part");
            return -1;
        }
        p->g = g;
        int64_t k = s->e[p->edges].k;
        Py_buffer *bs[] = {&p->rates, &p->cum, &p->q, &p->cum_q, &p->h, &p->weights,
                           &p->above, &p->lengths, &p->meas};
        Py_ssize_t sizes[] = {k * g, (k + 1) * g, k, k + 1, k, g, k, k, k};
        for (int j = 0; j < 9; j++)
            if (get(a[j], bs[j], 0, 8, sizes[j]) < 0) return -1;
        Py_ssize_t out_sizes[] = {s->n_sites, s->n_sites, s->n_sites, s->n_sites, s->n_sites,
                                  s->n_sites, s->n_sites, s->n_sites, s->n_sites,
                                  s->n_sites * s->n_reps, 2, s->n_reps};
        for (int j = 0; j < 12; j++)
            if (get(PyTuple_GET_ITEM(outs, j), &p->out[j], 1, 8, out_sizes[j]) < 0) return -1;
    }
    if (counts != Py_None) {
        if (!PyTuple_Check(counts) || PyTuple_GET_SIZE(counts) != 6) {
            PyErr_SetString(PyExc_ValueError, "counts: a tuple of 6 arrays");
            return -1;
        }
        Py_ssize_t sizes[] = {s->n_sites, s->n_sites, s->n_sites, s->n_sites,
                              s->n_sites * s->n_reps, s->n_reps};
        for (int j = 0; j < 6; j++)
            if (get(PyTuple_GET_ITEM(counts, j), &s->counts[j], 1, 8, sizes[j]) < 0) return -1;
        s->has_counts = 1;
    }
    for (int64_t i = 0; i < s->n_sites; i++) {
        int64_t g = I(s->site_grp)[i];
        for (int d = 0; d < s->nenergy; d++)
            if (g < 0 || g >= s->en[d].g) {
                PyErr_SetString(PyExc_ValueError, "a site's group is out of range");
                return -1;
            }
        for (int l = 0; l < s->nleaf; l++)
            if (g < 0 || g >= s->leaf[l].ncols) {
                PyErr_SetString(PyExc_ValueError, "a site's group is out of range");
                return -1;
            }
    }
    s->rec = sizeof(Head) + 2 * s->nenergy * sizeof(double);
    return 0;
}

static PyMethodDef Sweep_methods[] = {
    {"add", (PyCFunction)Sweep_add, METH_VARARGS,
     "add(site, thread, rep, t_start, t_end, status): int64 arrays of calls in start order"},
    {"flush", (PyCFunction)Sweep_flush, METH_NOARGS, "close every open call"},
    {"open_calls", (PyCFunction)Sweep_open, METH_NOARGS, "calls still open"},
    {NULL},
};

static PyTypeObject SweepType = {
    PyVarObject_HEAD_INIT(NULL, 0).tp_name = "fecomlite.analysis._sweep.Sweep",
    .tp_doc = "One pass over a run's calls in start order (see the module's docstring).",
    .tp_basicsize = sizeof(Sweep),
    .tp_flags = Py_TPFLAGS_DEFAULT,
    .tp_new = PyType_GenericNew,
    .tp_init = (initproc)Sweep_init,
    .tp_dealloc = (destructor)Sweep_dealloc,
    .tp_methods = Sweep_methods,
};

static struct PyModuleDef module = {
    PyModuleDef_HEAD_INIT, "_sweep", "The streamed analysis' sweep in C (see Sweep).", -1, NULL,
};

PyMODINIT_FUNC PyInit__sweep(void) {
    if (PyType_Ready(&SweepType) < 0) return NULL;
    PyObject *m = PyModule_Create(&module);
    if (!m) return NULL;
    Py_INCREF(&SweepType);
    if (PyModule_AddObject(m, "Sweep", (PyObject *)&SweepType) < 0) {
        Py_DECREF(&SweepType);
        Py_DECREF(m);
        return NULL;
    }
    return m;
}
