/* SPDX-License-Identifier: BSD-3-Clause */
/* csrc/leave.c's record of a rank's last leave, read while it changes.
 * One thread writes records 1..N as fast as it can, each a function of
 * its operation; another reads them all the while and checks that every
 * read it is given is one whole record, and no older than the last.
 * Then a writer stopped inside a rewrite: the read gives up, in bounded
 * time.  Prints "ok" and exits 0, or names the first broken rule. */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "xhc_internal.h"

#define RECORDS 2000000

static struct xhc_entered_line line;

static struct xhc_leave record_of(uint64_t seq)
{
    struct xhc_leave rec = { .seq = seq, .round = 3 * seq + 1,
                             .why = -(int32_t)(seq % 7) - 1,
                             .who = (int32_t)(seq % 5) };
    return rec;
}

static void *write_records(void *arg)
{
    (void)arg;
    for (uint64_t seq = 1; seq <= RECORDS; seq++) {
        struct xhc_leave rec = record_of(seq);
        xhc_leave_write(&line, &rec);
    }
    return NULL;
}

/* Read until the last record shows; 0, or 1 after printing what broke. */
static int read_records(long *whole, long *refused)
{
    uint64_t last = 0;
    while (last != RECORDS) {
        struct xhc_leave rec;
        if (!xhc_leave_read(&line, &rec)) {
            (*refused)++;
            continue;
        }
        struct xhc_leave want = record_of(rec.seq);
        if (memcmp(&rec, &want, sizeof rec) != 0) {
            printf("FAIL: operation %llu read with round %llu, why %d, "
                   "who %d\n", (unsigned long long)rec.seq,
                   (unsigned long long)rec.round, rec.why, rec.who);
            return 1;
        }
        if (rec.seq < last) {
            printf("FAIL: operation %llu read after %llu\n",
                   (unsigned long long)rec.seq, (unsigned long long)last);
            return 1;
        }
        last = rec.seq;
        (*whole)++;
    }
    return 0;
}

int main(void)
{
    pthread_t writer;
    long whole = 0, refused = 0;
    struct xhc_leave first = record_of(0);
    xhc_leave_write(&line, &first);
    pthread_create(&writer, NULL, write_records, NULL);
    int failed = read_records(&whole, &refused);
    pthread_join(writer, NULL);
    if (failed)
        return 1;
    if (whole < 2) {
        printf("FAIL: only %ld whole reads\n", whole);
        return 1;
    }
    /* A writer stopped between its first store and its last. */
    atomic_fetch_add(&line.version, 1);
    struct xhc_leave rec;
    if (xhc_leave_read(&line, &rec)) {
        printf("FAIL: a record in the middle of a rewrite was read\n");
        return 1;
    }
    printf("ok\n");
    return 0;
}
