// threadpool.c - the threads of a context: n-1 workers plus the calling thread run the tasks of
// one parallel loop, taking task indices from an atomic counter. A loop's result never depends on
// which thread ran which task, as long as each task writes only its own outputs (every kernel is
// written that way), so results are identical for every thread count.
//
// Owned by one context: attn__pool_run must not be called from two threads at once (a context is
// used by one thread at a time). Between loops a worker first spins for a short while (about
// 0.2 ms) watching for the next loop, then sleeps on a condition variable: waking a sleeping
// thread can take a millisecond, as long as a whole short attention call. So the caller never
// waits for a worker that has not started: once every task is taken it closes the loop, and only
// the workers that joined it before (those still running a task) are waited for; a worker that
// wakes up after that finds the loop closed and goes back to waiting.
//
// A pool made with a caller's executor (attn_executor) starts no threads: a loop is one call of
// executor.parallel, whose calls of exec_task take tasks from the same counter; what none took
// (an executor that ran no call) the caller runs after it returns. attn_executor_gomp, at the
// end, is the executor on an OpenMP runtime.
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <string.h>

#include "internal.h"

#define SPIN_ROUNDS 4096 // polls (each a few pause instructions) before a worker sleeps
// Loops smaller than this run on the calling thread: one decoding step of 12 heads (D = 64, f32)
// over 128 keys took 0.065 ms on one thread and 0.094 ms on two, the two equal near 512 keys
// (1.6 MFLOP), and a worker that has gone to sleep (or shares its core with another program's
// spinning threads, as inside PyTorch) takes far longer to wake.
#define ATTN_SERIAL_FLOPS 1.0e6

struct attn__pool {
    attn_allocator alloc;
    int n;                // threads including the caller
    attn_executor exec;   // parallel != NULL: loops run through it, no workers
    pthread_t *workers;   // n - 1
    pthread_mutex_t mu;
    pthread_cond_t wake, done;
    atomic_uint_fast64_t generation; // incremented for every loop (written under mu)
    atomic_int active;    // workers that joined the current loop and have not left it
    bool open;            // guarded by mu: workers may still join the current loop
    bool stop;            // guarded by mu
    // the current loop (written under mu before generation changes)
    attn__task_fn fn;
    void *arg;
    int64_t n_tasks;
    atomic_int_fast64_t next;
};

typedef struct worker_arg {
    attn__pool *pool;
    int index;
} worker_arg;

static void run_tasks(attn__pool *p, attn__task_fn fn, void *arg, int64_t n_tasks, int thread) {
    for (;;) {
        int64_t t = atomic_fetch_add_explicit(&p->next, 1, memory_order_relaxed);
        if (t >= n_tasks) return;
        fn(arg, t, thread);
    }
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

// One round of a spin-wait: a few pause instructions, and every 16th round a sched_yield, so that a
// thread the scheduler put on the same CPU (it happens: then every loop waited for a time slice, and
// a short attention call took four times as long) gets to run instead of waiting for the spinner.
static inline void spin_round(int i) {
    if ((i & 15) == 15)
        sched_yield();
    else
        for (int k = 0; k < 8; k++) cpu_relax();
}

static void *worker_main(void *varg) {
    worker_arg *wa = varg;
    attn__pool *p = wa->pool;
    const int index = wa->index;
    uint64_t seen = 0;
    for (;;) {
        // spin a little: the next loop usually follows soon
        for (int i = 0; i < SPIN_ROUNDS && atomic_load_explicit(&p->generation, memory_order_acquire) == seen; i++)
            spin_round(i);
        pthread_mutex_lock(&p->mu);
        while (!p->stop && atomic_load_explicit(&p->generation, memory_order_acquire) == seen)
            pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) {
            pthread_mutex_unlock(&p->mu);
            return NULL;
        }
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        if (!p->open) { // woken too late: the caller has taken every task and returned or is returning
            pthread_mutex_unlock(&p->mu);
            continue;
        }
        atomic_fetch_add_explicit(&p->active, 1, memory_order_relaxed);
        attn__task_fn fn = p->fn;
        void *arg = p->arg;
        int64_t n_tasks = p->n_tasks;
        pthread_mutex_unlock(&p->mu);
        run_tasks(p, fn, arg, n_tasks, index);
        if (atomic_fetch_sub_explicit(&p->active, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu); // the caller may be asleep waiting for this
            pthread_cond_signal(&p->done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

// The worker arguments live right after the pool in the same allocation.
static worker_arg *worker_args(attn__pool *p) { return (worker_arg *)(p + 1); }

attn_status attn__pool_create(attn_ctx *ctx, int n_threads, const attn_executor *executor, attn__pool **out) {
    *out = NULL;
    if (n_threads <= 1) return ATTN_OK; // no pool: loops run on the caller
    attn__pool *p;
    const bool own = executor == NULL || executor->parallel == NULL;
    size_t bytes = sizeof *p + (own ? (size_t)(n_threads - 1) * sizeof(worker_arg) : 0);
    ATTN_RETURN_IF_ERR(attn__alloc(ctx, bytes, (void **)&p));
    memset(p, 0, bytes);
    p->alloc = ctx->alloc;
    p->n = n_threads;
    atomic_init(&p->next, 0);
    if (!own) {
        p->exec = *executor;
        *out = p;
        return ATTN_OK;
    }
    attn_status st = attn__alloc(ctx, (size_t)(n_threads - 1) * sizeof(pthread_t), (void **)&p->workers);
    if (st != ATTN_OK) {
        attn__free(ctx, p);
        return st;
    }
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    atomic_init(&p->generation, 0);
    atomic_init(&p->active, 0);
    int started = 0;
    for (; started < n_threads - 1; started++) {
        worker_args(p)[started] = (worker_arg){p, started + 1};
        if (pthread_create(&p->workers[started], NULL, worker_main, &worker_args(p)[started]) != 0) break;
    }
    if (started < n_threads - 1) {
        p->n = started + 1;
        attn__pool_free(p);
        return attn__fail(ctx, ATTN_ERR_OUT_OF_MEMORY, "could not start %d threads (started %d)", n_threads - 1, started);
    }
    *out = p;
    return ATTN_OK;
}

void attn__pool_free(attn__pool *p) {
    if (p == NULL) return;
    if (p->exec.parallel != NULL) {
        attn_allocator a = p->alloc;
        attn__free_with(&a, p);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->stop = true;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->n - 1; i++) pthread_join(p->workers[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    attn_allocator a = p->alloc;
    attn__free_with(&a, p->workers);
    attn__free_with(&a, p);
}

int attn__pool_threads(const attn__pool *p) { return p != NULL ? p->n : 1; }

attn__pool *attn__pool_for(attn__pool *p, double flops) { return flops < ATTN_SERIAL_FLOPS ? NULL : p; }

// One call of an executor's `parallel`: tasks from the loop's counter, as thread i (an index out of
// range takes none).
static void exec_task(void *arg, int i) {
    attn__pool *p = arg;
    if (i >= 0 && i < p->n) run_tasks(p, p->fn, p->arg, p->n_tasks, i);
}

void attn__pool_run(attn__pool *p, int64_t n_tasks, attn__task_fn fn, void *arg) {
    if (n_tasks <= 0) return;
    if (p == NULL || n_tasks == 1) {
        for (int64_t t = 0; t < n_tasks; t++) fn(arg, t, 0);
        return;
    }
    if (p->exec.parallel != NULL) {
        p->fn = fn, p->arg = arg, p->n_tasks = n_tasks;
        atomic_store_explicit(&p->next, 0, memory_order_relaxed);
        p->exec.parallel(p->exec.user, p->n, exec_task, p);
        run_tasks(p, fn, arg, n_tasks, 0); // what no call took: nothing, for an executor that ran them
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n_tasks = n_tasks;
    atomic_store_explicit(&p->next, 0, memory_order_relaxed);
    p->open = true;
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release); // publishes the loop
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    run_tasks(p, fn, arg, n_tasks, 0);
    // Every task is taken: no worker joins from now on. Wait for those that joined and may still
    // be running a task: spin briefly (yielding, for a worker sharing this CPU), then sleep.
    pthread_mutex_lock(&p->mu);
    p->open = false;
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < 256 && atomic_load_explicit(&p->active, memory_order_acquire) > 0; i++) spin_round(i);
    if (atomic_load_explicit(&p->active, memory_order_acquire) > 0) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load_explicit(&p->active, memory_order_acquire) > 0) pthread_cond_wait(&p->done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

// ---- an executor on an OpenMP runtime ---------------------------------------------------------

// GOMP_parallel(fn, data, num_threads, flags): runs fn(data) on a team of num_threads threads (the
// caller's among them) and returns after the team's closing barrier.
typedef void (*gomp_parallel_fn)(void (*fn)(void *), void *data, unsigned num_threads, unsigned flags);

typedef struct gomp_loop {
    void (*task)(void *task_arg, int i);
    void *task_arg;
    int n;
    atomic_int next; // the next index i to run
} gomp_loop;

// The parallel region's body: each team thread runs the indices it takes, until none is left.
static void gomp_body(void *data) {
    gomp_loop *l = data;
    for (int i; (i = atomic_fetch_add_explicit(&l->next, 1, memory_order_relaxed)) < l->n;) l->task(l->task_arg, i);
}

_Static_assert(sizeof(gomp_parallel_fn) == sizeof(void *), "an entry point passed as dlsym returns it");

static void gomp_parallel(void *user, int n, void (*task)(void *task_arg, int i), void *task_arg) {
    gomp_parallel_fn run;
    memcpy(&run, &user, sizeof run); // the entry point, as dlsym returned it
    gomp_loop l = {task, task_arg, n, 0};
    run(gomp_body, &l, (unsigned)n, 0);
}

attn_status attn_executor_gomp(void *gomp_parallel_symbol, attn_executor *out) {
    if (gomp_parallel_symbol == NULL || out == NULL) return ATTN_ERR_INVALID_ARG;
    *out = (attn_executor){gomp_parallel, gomp_parallel_symbol};
    return ATTN_OK;
}
