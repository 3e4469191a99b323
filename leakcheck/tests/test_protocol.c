/* test_protocol.c - the record codec and the schedule the driver and the
 * worker share (leakcheck/shared/), without a worker (Check).
 *
 * The protocol document (the comment of lc_protocol.h) is checked against
 * the codec's table of record types, and every record type survives its
 * encoder and its decoder.  The schedule is checked against the loop the
 * worker ran before it was one function.
 */
#define _GNU_SOURCE
#undef NDEBUG
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lc_protocol.h"
#include "lc_schedule.h"

#ifndef LC_PROTOCOL_H_PATH
#error LC_PROTOCOL_H_PATH must name shared/lc_protocol.h
#endif

/* --- the document ----------------------------------------------------------- */
/* Lines of the header comment that document a record: " *   X ..." */
static int doc_record_lines(char lines[][1000], int max)
{
    FILE *f = fopen(LC_PROTOCOL_H_PATH, "r");
    ck_assert_msg(f != NULL, "cannot open %s", LC_PROTOCOL_H_PATH);
    char buf[1000];
    int n = 0;
    while (fgets(buf, sizeof buf, f) && !strstr(buf, "*/")) {
        buf[strcspn(buf, "\n")] = 0;
        if (strncmp(buf, " *   ", 5) == 0 && buf[5] >= 'A' && buf[5] <= 'Z' && (buf[6] == ' ' || buf[6] == 0)
            && n < max)
            snprintf(lines[n++], sizeof lines[0], "%s", buf + 5);
    }
    fclose(f);
    return n;
}

START_TEST(test_document_matches_codec)
{
    char lines[64][1000];
    int n = doc_record_lines(lines, 64);
    ck_assert_msg((size_t)n == lc_nrecord_specs, "lc_protocol.h documents %d record types, the codec knows %zu", n,
                  lc_nrecord_specs);
    for (size_t i = 0; i < lc_nrecord_specs; i++) {
        const char *syn = lc_record_specs[i].syntax;
        size_t l = strlen(syn);
        int found = 0;
        for (int j = 0; j < n; j++)
            found |= strncmp(lines[j], syn, l) == 0 && (lines[j][l] == ' ' || lines[j][l] == 0);
        ck_assert_msg(found, "lc_protocol.h does not document '%s' as the codec does", syn);
        ck_assert_int_eq(syn[0], lc_record_specs[i].type);
    }
}
END_TEST

/* --- encoding and decoding ----------------------------------------------------- */
static const lc_record_spec *spec_of(char type)
{
    for (size_t i = 0; i < lc_nrecord_specs; i++)
        if (lc_record_specs[i].type == type) return &lc_record_specs[i];
    return NULL;
}

/* The line has the fields its documented syntax names: <values> stands for
 * LC_NVALUES numbers, a last <text...> for one or more words. */
static void check_shape(const lc_line *l)
{
    ck_assert_msg(l->n > 0 && l->s[l->n - 1] == '\n' && strlen(l->s) == l->n, "not one line: '%s'", l->s);
    const lc_record_spec *sp = spec_of(l->s[0]);
    ck_assert_msg(sp != NULL, "no spec for '%c'", l->s[0]);
    int want = 0, open_ended = 0, have = 0;
    char syn[200], line[LC_LINE_MAX];
    snprintf(syn, sizeof syn, "%s", sp->syntax);
    for (char *save = NULL, *t = strtok_r(syn, " ", &save); t; t = strtok_r(NULL, " ", &save)) {
        if (!strcmp(t, "<values>")) want += LC_NVALUES;
        else if (strstr(t, "...>")) open_ended = 1, want++;
        else if (t[0] == '<' || t == syn) want++;
        /* words inside a <...> field ("<python line...>") are one field */
    }
    snprintf(line, sizeof line, "%.*s", (int)l->n - 1, l->s);
    for (char *save = NULL, *t = strtok_r(line, " ", &save); t; t = strtok_r(NULL, " ", &save)) have++;
    if (open_ended) ck_assert_msg(have >= want - 1, "'%s' has %d fields, '%s' wants %d", l->s, have, sp->syntax, want);
    else ck_assert_msg(have == want, "'%s' has %d fields, '%s' wants %d", l->s, have, sp->syntax, want);
}

static lc_record round_trip(lc_line *l)
{
    check_shape(l);
    l->s[l->n - 1] = 0;   /* the decoder reads a line without its newline */
    lc_record r;
    ck_assert_msg(lc_decode(l->s, &r) == 0, "'%s' does not decode", l->s);
    ck_assert_int_eq(r.type, l->s[0]);
    return r;
}

START_TEST(test_every_record_round_trips)
{
    lc_line l;
    lc_record r;
    int64_t v[LC_NVALUES];
    for (int i = 0; i < LC_NVALUES; i++) v[i] = i == 3 ? -1 : (int64_t)i * 1000003;
    lc_enc_info(&l, "executable", "/usr/bin/python3 x");
    r = round_trip(&l);
    ck_assert_str_eq(r.u.info.key, "executable");
    ck_assert_str_eq(r.u.info.value, "/usr/bin/python3 x");
    lc_enc_info(&l, "abiflags", "");
    r = round_trip(&l);
    ck_assert_str_eq(r.u.info.value, "");
    lc_enc_avail(&l, "refs", 0, "not a debug build");
    r = round_trip(&l);
    ck_assert_str_eq(r.u.avail.meter, "refs");
    ck_assert_int_eq(r.u.avail.available, 0);
    ck_assert_str_eq(r.u.avail.how, "not a debug build");
    lc_enc_reading(&l, v);
    r = round_trip(&l);
    ck_assert_mem_eq(r.u.reading.v, v, sizeof v);
    lc_cycle_id id = {17, 'B', 8, 1};
    lc_enc_begin(&l, &id);
    r = round_trip(&l);
    ck_assert(r.u.cycle.id.seq == 17 && r.u.cycle.id.kind == 'B' && r.u.cycle.id.round == 8 && r.u.cycle.id.judged);
    lc_enc_cycle(&l, &id, v);
    r = round_trip(&l);
    ck_assert(r.u.cycle.id.seq == 17 && r.u.cycle.id.kind == 'B');
    ck_assert_mem_eq(r.u.cycle.v, v, sizeof v);
    lc_enc_obm(&l, 5, 1498);
    r = round_trip(&l);
    ck_assert(r.u.obm.seq == 5 && r.u.obm.blocks == 1498);
    const int64_t bytes[2] = {6400, -64}, blocks[2] = {100, 0};
    lc_enc_site(&l, 42, "obmalloc", bytes, blocks);
    r = round_trip(&l);
    ck_assert(r.u.site.site == 42 && !strcmp(r.u.site.domain, "obmalloc"));
    ck_assert(r.u.site.bytes[0] == 6400 && r.u.site.bytes[1] == -64 && r.u.site.blocks[0] == 100);
    lc_enc_frame(&l, 42, 3, "leak64_exec (leak64.c:55) [_pyfini_leak64.so]");
    r = round_trip(&l);
    ck_assert(r.u.frame.site == 42 && r.u.frame.n == 3);
    ck_assert_str_eq(r.u.frame.text, "leak64_exec (leak64.c:55) [_pyfini_leak64.so]");
    lc_enc_pyline(&l, 42, 0, "(import machinery, 5 frames)");
    r = round_trip(&l);
    ck_assert_str_eq(r.u.frame.text, "(import machinery, 5 frames)");
    lc_enc_child(&l, 7, 12345, -1, 6);
    r = round_trip(&l);
    ck_assert(r.u.child.seq == 7 && r.u.child.pid == 12345 && r.u.child.exit_code == -1 && r.u.child.signal == 6);
    lc_enc_extension(&l, "_json", "/usr/lib/python3.13/lib-dynload/_json.so");
    r = round_trip(&l);
    ck_assert_str_eq(r.u.ext.module, "_json");
    ck_assert_str_eq(r.u.ext.path, "/usr/lib/python3.13/lib-dynload/_json.so");
    lc_enc_error(&l, LC_ERR_SUBJECT, 1, "the subject failed in cycle 3 (isolated interpreter): import x: E: m");
    r = round_trip(&l);
    ck_assert(r.u.error.kind == LC_ERR_SUBJECT && r.u.error.refused == 1);
    ck_assert_str_eq(r.u.error.message, "the subject failed in cycle 3 (isolated interpreter): import x: E: m");
    lc_enc_done(&l);
    round_trip(&l);
}
END_TEST

START_TEST(test_error_kinds_round_trip)
{
    for (int k = 0; k < LC_NERROR_KINDS; k++) {
        lc_line l;
        lc_enc_error(&l, (enum lc_error_kind)k, 0, "x");
        lc_record r = round_trip(&l);
        ck_assert_int_eq(r.u.error.kind, k);
        ck_assert_str_eq(lc_error_kind_name(r.u.error.kind), lc_error_kind_name((enum lc_error_kind)k));
    }
}
END_TEST

START_TEST(test_text_stays_one_line)
{
    lc_line l;
    lc_enc_error(&l, LC_ERR_USAGE, 0, "two\nlines\r\n");
    ck_assert_str_eq(l.s, "E usage 0 two lines  \n");
    char big[LC_LINE_MAX * 2];
    memset(big, 'x', sizeof big - 1);
    big[sizeof big - 1] = 0;
    lc_enc_info(&l, "k", big);
    ck_assert(l.n == LC_LINE_MAX - 1 && l.s[l.n - 1] == '\n' && strlen(l.s) == l.n);
}
END_TEST

START_TEST(test_malformed_lines_refused)
{
    static const char *const bad[] = {"", "Q x", "B", "B 1 X 0 1", "B 1 S 0 2", "B 1 S 0 1 extra", "C 1 S 0 1 1 2",
                                      "O 1", "O x 2", "W 1 raw 1 2 3", "E usage", "E usage 7 m", "D x", "Ix"};
    lc_record r;
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        ck_assert_msg(lc_decode(bad[i], &r) < 0, "'%s' decoded", bad[i]);
}
END_TEST

/* --- the schedule ----------------------------------------------------------------- */
typedef struct ref_slot {
    int subject, judged;
    long round;
} ref_slot;

/* The worker's loop before lc_schedule (pyfini 0.1.0, worker.c main()). */
static long reference_schedule(long warmup, long cycles, int subject, int baseline, ref_slot *out)
{
    int paired = subject && baseline;
    long block = cycles / 10 < 1 ? 1 : (cycles / 10 > 10 ? 10 : cycles / 10);
    long total = (warmup + cycles) * (paired ? 2 : 1);
    for (long i = 0, done = 0, in_block = 0, k = 0; i < total; i++) {
        ref_slot *s = &out[i];
        if (i < warmup * (paired ? 2 : 1)) {
            s->judged = 0;
            s->round = paired ? i / 2 : i;
            s->subject = paired ? (i % 2 == 0) : subject;
        } else if (!paired) {
            s->judged = 1;
            s->round = warmup + done++;
            s->subject = subject;
        } else {
            s->judged = 1;
            if (in_block == 0) k = block < cycles - done ? block : cycles - done;
            s->subject = in_block < k;
            s->round = warmup + done + (in_block % k);
            if (++in_block == 2 * k) done += k, in_block = 0;
        }
    }
    return total;
}

/* cycles: every count up to 3 blocks of 10, and around the block limits */
static const long schedule_cycles[] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 19, 20, 21, 29, 30, 31,
                                       99, 100, 101, 109, 110, 111, 130};

START_TEST(test_schedule_as_the_worker_ran_it)
{
    static ref_slot ref[2 * (4 + 130)];
    for (long warmup = 0; warmup <= 3; warmup++)
        for (size_t ci = 0; ci < sizeof schedule_cycles / sizeof *schedule_cycles; ci++)
            for (int subject = 0; subject < 2; subject++)
                for (int baseline = 0; baseline < 2; baseline++) {
                    long cycles = schedule_cycles[ci];
                    long n = reference_schedule(warmup, cycles, subject, baseline, ref);
                    lc_schedule s = lc_schedule_make(warmup, cycles, subject, baseline);
                    ck_assert_int_eq(lc_schedule_length(&s), n);
                    long side[2] = {0, 0};
                    for (long i = 0; i < n; i++) {
                        lc_slot sl = lc_schedule_at(&s, i);
                        if (sl.subject != ref[i].subject || sl.judged != ref[i].judged || sl.round != ref[i].round)
                            ck_abort_msg("warmup %ld cycles %ld subject %d baseline %d: cycle %ld differs", warmup,
                                         cycles, subject, baseline, i);
                        if (sl.judged) side[sl.side]++;
                        if (sl.judged && s.paired && (sl.subject != (sl.block_pos < sl.block_len) || sl.block_len > s.block))
                            ck_abort_msg("cycles %ld: cycle %ld is not where its block says", cycles, i);
                    }
                    ck_assert(side[0] == s.n_side[0] && side[1] == s.n_side[1]);
                }
}
END_TEST

START_TEST(test_schedule_excess)
{
    lc_schedule s = lc_schedule_make(10, 100, 1, 1);
    ck_assert_int_eq(s.block, 10);
    ck_assert(lc_schedule_excess(&s, 6400 + 100 * 77, 100 * 77) == 64.0);
    s = lc_schedule_make(10, 100, 0, 1);   /* no subject: the bare cycles are side 0 */
    ck_assert(lc_schedule_excess(&s, 6400, 0) == 64.0);
}
END_TEST

int main(void)
{
    Suite *su = suite_create("protocol");
    TCase *tc = tcase_create("protocol");
    tcase_set_timeout(tc, 60);   /* ASan builds are slow */
    tcase_add_test(tc, test_document_matches_codec);
    tcase_add_test(tc, test_every_record_round_trips);
    tcase_add_test(tc, test_error_kinds_round_trip);
    tcase_add_test(tc, test_text_stays_one_line);
    tcase_add_test(tc, test_malformed_lines_refused);
    tcase_add_test(tc, test_schedule_as_the_worker_ran_it);
    tcase_add_test(tc, test_schedule_excess);
    suite_add_tcase(su, tc);
    SRunner *sr = srunner_create(su);
    srunner_run_all(sr, CK_NORMAL);
    int failed = srunner_ntests_failed(sr);
    srunner_free(sr);
    return failed == 0 ? 0 : 1;
}
