/* gymloop sandbox launcher: join the slot's network namespace, apply rlimits, drop to an
 * unprivileged uid/gid, exec. One exec instead of nsenter + prlimit + setpriv.
 * usage: sandbox-exec UID NETNS CPU AS NPROC FSIZE NOFILE -- PROG ARGS...
 *   UID -1: keep the caller's ids; NETNS "-": keep the caller's network namespace. */
#define _GNU_SOURCE
#include <fcntl.h>
#include <grp.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

static void lim(int res, unsigned long long soft, unsigned long long hard) {
  struct rlimit r = {soft, hard};
  if (setrlimit(res, &r)) { perror("sandbox-exec: setrlimit"); _exit(126); }
}

int main(int argc, char **argv) {
  if (argc < 10 || strcmp(argv[8], "--")) {
    fprintf(stderr, "usage: sandbox-exec UID NETNS CPU AS NPROC FSIZE NOFILE -- PROG...\n");
    return 125;
  }
  if (strcmp(argv[2], "-")) {
    int fd = open(argv[2], O_RDONLY | O_CLOEXEC);
    if (fd < 0 || setns(fd, CLONE_NEWNET)) { perror("sandbox-exec: setns"); return 126; }
    close(fd);
  }
  unsigned long long cpu = strtoull(argv[3], 0, 10);
  lim(RLIMIT_CPU, cpu, cpu + 1);
  unsigned long long v;
  v = strtoull(argv[4], 0, 10); lim(RLIMIT_AS, v, v);
  v = strtoull(argv[5], 0, 10); lim(RLIMIT_NPROC, v, v);
  v = strtoull(argv[6], 0, 10); lim(RLIMIT_FSIZE, v, v);
  v = strtoull(argv[7], 0, 10); lim(RLIMIT_NOFILE, v, v);
  lim(RLIMIT_CORE, 0, 0);
  long uid = strtol(argv[1], 0, 10);
  if (uid >= 0 && (uid_t)uid != getuid()) {
    if (setgroups(0, NULL) || setresgid(uid, uid, uid) || setresuid(uid, uid, uid)) {
      perror("sandbox-exec: drop privileges"); return 126;
    }
  }
  execvp(argv[9], argv + 9);
  perror("sandbox-exec: exec");
  return 127;
}
