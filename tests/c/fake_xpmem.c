/* SPDX-License-Identifier: BSD-3-Clause */
/* fake_xpmem.c: a stand-in for libxpmem, for machines without XPMEM.
 *
 * Build: cc -shared -fPIC -pthread fake_xpmem.c -o DIR/libxpmem.so.0, and
 * put DIR on LD_LIBRARY_PATH; the core's dlopen then finds this.
 *
 * 1. Attachments are the identity: attaching offset X of a segment
 *    returns X.  That is only right when reader and owner share one
 *    address space, so the tests run their ranks as threads of one
 *    process (whatever memory a "peer" owns is then at the same address
 *    here).  A thread stands for a process: its attachments are its own,
 *    and a detach looks among them only.  All calls are thread-safe.
 * 2. Every call checks what it is given as the real module would, and
 *    more strictly: live segment ids and permits, the permission modes
 *    the core asks for, page-aligned offsets and sizes, detaches of a
 *    live attachment's own address, releases only after the permit's
 *    attachments are detached.  A violation is counted, printed to
 *    stderr and failed with EINVAL.  (A read through an attachment after
 *    its detach cannot be seen: the identity mapping stays valid.)
 * 3. fake_xpmem_report() returns every counter as JSON, for the tests to
 *    check that the core's cache stays bounded and that closing leaves
 *    no segment, permit or attachment behind.
 * 4. Environment: FAKE_XPMEM_NODEV=1 makes xpmem_version() fail, as the
 *    real library does without /dev/xpmem; FAKE_XPMEM_FAIL_ATTACH=1 makes
 *    every attach fail.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/types.h>
#include <unistd.h>

typedef int64_t xpmem_segid_t;
typedef int64_t xpmem_apid_t;
struct xpmem_addr {
    xpmem_apid_t apid;
    off_t offset;
};
#define XPMEM_RDONLY 0x1
#define XPMEM_RDWR 0x2
#define XPMEM_PERMIT_MODE 0x1
#define XPMEM_MAXADDR_SIZE ((size_t)-1L)

#define MAX_SEGS 64
#define MAX_APIDS 1024
#define MAX_ATTS 8192

struct apid_entry {
    xpmem_apid_t apid; /* 0: free */
    int live_atts;
};

struct att_entry {
    uintptr_t addr; /* 0: free */
    size_t size;
    xpmem_apid_t apid;
    pthread_t owner; /* the thread that attached it */
};

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static xpmem_segid_t segs[MAX_SEGS];
static struct apid_entry apids[MAX_APIDS];
static struct att_entry atts[MAX_ATTS];
static int64_t next_id = 0x7000;
static struct {
    long long makes, removes, gets, releases, attaches, detaches;
    long long live_segs, live_apids, live_atts, max_live_atts;
    long long max_atts_per_apid, errors;
} n;
static char first_error[256];
static char report[1024];

/* Count and print a violation; the caller returns -1 with EINVAL. */
static void violation(const char *fmt, ...)
{
    char msg[200];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof(msg), fmt, ap);
    va_end(ap);
    fprintf(stderr, "fake_xpmem: %s\n", msg);
    if (n.errors++ == 0)
        snprintf(first_error, sizeof(first_error), "%s", msg);
    errno = EINVAL;
}

static int env_set(const char *name)
{
    const char *v = getenv(name);
    return v && *v && *v != '0';
}

static size_t page_size(void)
{
    return (size_t)sysconf(_SC_PAGESIZE);
}

static struct apid_entry *find_apid(xpmem_apid_t apid)
{
    for (int i = 0; apid > 0 && i < MAX_APIDS; i++)
        if (apids[i].apid == apid)
            return &apids[i];
    return NULL;
}

static int find_seg(xpmem_segid_t segid)
{
    for (int i = 0; segid > 0 && i < MAX_SEGS; i++)
        if (segs[i] == segid)
            return i;
    return -1;
}

int xpmem_version(void)
{
    if (env_set("FAKE_XPMEM_NODEV")) {
        errno = ENOENT;
        return -1;
    }
    return 0x00022000;
}

xpmem_segid_t xpmem_make(void *vaddr, size_t size, int permit_type,
                         void *permit_value)
{
    xpmem_segid_t out = -1;
    pthread_mutex_lock(&lock);
    int slot = -1;
    for (int i = 0; i < MAX_SEGS; i++)
        if (segs[i] == 0) {
            slot = i;
            break;
        }
    if (vaddr != NULL || size != XPMEM_MAXADDR_SIZE)
        violation("make(%p, %zu): want the whole address space", vaddr,
                  size);
    else if (permit_type != XPMEM_PERMIT_MODE
             || (uintptr_t)permit_value != 0600)
        violation("make: permit %d/0%lo, want XPMEM_PERMIT_MODE/0600",
                  permit_type, (unsigned long)(uintptr_t)permit_value);
    else if (slot < 0)
        violation("make: more than %d live segments", MAX_SEGS);
    else {
        out = segs[slot] = ++next_id;
        n.makes++;
        n.live_segs++;
    }
    pthread_mutex_unlock(&lock);
    return out;
}

int xpmem_remove(xpmem_segid_t segid)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    int i = find_seg(segid);
    if (i < 0)
        violation("remove(%lld): no such segment", (long long)segid);
    else {
        segs[i] = 0;
        n.removes++;
        n.live_segs--;
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

xpmem_apid_t xpmem_get(xpmem_segid_t segid, int flags, int permit_type,
                       void *permit_value)
{
    xpmem_apid_t out = -1;
    pthread_mutex_lock(&lock);
    struct apid_entry *e = NULL;
    for (int i = 0; i < MAX_APIDS && !e; i++)
        if (apids[i].apid == 0)
            e = &apids[i];
    if (find_seg(segid) < 0)
        violation("get(%lld): no such segment", (long long)segid);
    else if (flags != XPMEM_RDWR && flags != XPMEM_RDONLY)
        violation("get: flags %d", flags);
    else if (permit_type != XPMEM_PERMIT_MODE || permit_value != NULL)
        violation("get: permit %d/%p, want XPMEM_PERMIT_MODE/NULL",
                  permit_type, permit_value);
    else if (!e)
        violation("get: more than %d live permits", MAX_APIDS);
    else {
        out = e->apid = ++next_id;
        e->live_atts = 0;
        n.gets++;
        n.live_apids++;
    }
    pthread_mutex_unlock(&lock);
    return out;
}

int xpmem_release(xpmem_apid_t apid)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    struct apid_entry *e = find_apid(apid);
    if (!e)
        violation("release(%lld): no such permit", (long long)apid);
    else if (e->live_atts)
        violation("release(%lld) with %d attachments not detached",
                  (long long)apid, e->live_atts);
    else {
        e->apid = 0;
        n.releases++;
        n.live_apids--;
        rc = 0;
    }
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Record a new attachment of [ADDR, ADDR + SIZE) under permit E. */
static int add_att(struct apid_entry *e, uintptr_t addr, size_t size)
{
    for (int i = 0; i < MAX_ATTS; i++)
        if (atts[i].addr == 0) {
            atts[i] = (struct att_entry){ addr, size, e->apid,
                                          pthread_self() };
            n.attaches++;
            if (++n.live_atts > n.max_live_atts)
                n.max_live_atts = n.live_atts;
            if (++e->live_atts > n.max_atts_per_apid)
                n.max_atts_per_apid = e->live_atts;
            return 0;
        }
    violation("attach: more than %d live attachments", MAX_ATTS);
    return -1;
}

void *xpmem_attach(struct xpmem_addr addr, size_t size, void *vaddr)
{
    void *out = (void *)-1;
    size_t page = page_size();
    pthread_mutex_lock(&lock);
    struct apid_entry *e = find_apid(addr.apid);
    if (!e)
        violation("attach: no such permit %lld", (long long)addr.apid);
    else if (addr.offset <= 0 || (size_t)addr.offset % page || size == 0
             || size % page || vaddr != NULL)
        violation("attach(offset %#llx, size %zu, at %p): want whole "
                  "pages, anywhere", (long long)addr.offset, size, vaddr);
    else if (env_set("FAKE_XPMEM_FAIL_ATTACH"))
        errno = EFAULT; /* a failure of the kind asked for, not a fault */
    else if (add_att(e, (uintptr_t)addr.offset, size) == 0)
        out = (void *)(uintptr_t)addr.offset;
    pthread_mutex_unlock(&lock);
    return out;
}

int xpmem_detach(void *vaddr)
{
    int rc = -1;
    pthread_mutex_lock(&lock);
    for (int i = 0; i < MAX_ATTS && rc; i++)
        if (atts[i].addr && atts[i].addr == (uintptr_t)vaddr
            && pthread_equal(atts[i].owner, pthread_self())) {
            struct apid_entry *e = find_apid(atts[i].apid);
            if (e)
                e->live_atts--;
            atts[i].addr = 0;
            n.detaches++;
            n.live_atts--;
            rc = 0;
        }
    if (rc)
        violation("detach(%p): not the address of a live attachment",
                  vaddr);
    pthread_mutex_unlock(&lock);
    return rc;
}

/* Every counter, and the first violation, as one JSON object. */
const char *fake_xpmem_report(void)
{
    pthread_mutex_lock(&lock);
    snprintf(report, sizeof(report),
             "{\"makes\": %lld, \"removes\": %lld, \"gets\": %lld, "
             "\"releases\": %lld, \"attaches\": %lld, \"detaches\": %lld, "
             "\"live_segs\": %lld, \"live_apids\": %lld, "
             "\"live_atts\": %lld, \"max_live_atts\": %lld, "
             "\"max_atts_per_apid\": %lld, \"errors\": %lld, "
             "\"page\": %zu}",
             n.makes, n.removes, n.gets, n.releases, n.attaches,
             n.detaches, n.live_segs, n.live_apids, n.live_atts,
             n.max_live_atts, n.max_atts_per_apid, n.errors, page_size());
    pthread_mutex_unlock(&lock);
    return report;
}

const char *fake_xpmem_first_error(void)
{
    return first_error;
}
