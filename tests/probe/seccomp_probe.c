/*
 * seccomp_probe: run inside a sandbox (or under `sandboxd seccomp run`),
 * issue every call the profile denies and check the exact errno.
 *
 *   seccomp_probe [LIST]
 *
 * LIST (from `sandboxd seccomp expect`) has one "<nr> <name> <errno>" per
 * line: calls whose outcome does not depend on the arguments. Each is issued
 * with raw syscall(2) and harmless arguments (all -1: bad fds, bad pointers,
 * invalid flags), so even if the filter let one through it would fail in the
 * kernel's argument checks instead of doing anything.
 *
 * Built in, because they depend on arguments: both sides of every argument
 * rule (clone namespace flags, socket families, ioctl TIOCSTI/TIOCLINUX,
 * personality), clone3 with a valid struct, and numbers above the table.
 *
 * Output: one "ok ..." / "FAIL ..." / "skip ..." line per check, then
 * "summary: N checks, M failures". Exit 0 only if nothing failed.
 * Self-contained: libc only, no arguments required.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

static int checks, failures;

static void report(int ok, const char *what, long ret, int err, const char *want)
{
	checks++;
	if (!ok)
		failures++;
	printf("%s %s ret=%ld errno=%d(%s) want=%s\n", ok ? "ok" : "FAIL", what, ret, err,
	       err ? (strerrorname_np(err) ? strerrorname_np(err) : "?") : "0", want);
	fflush(stdout);
}

/* Reap a child that a wrongly allowed clone created. */
static void reap(long pid)
{
	if (pid > 0)
		waitpid((pid_t)pid, NULL, 0);
}

/* Expect the raw call to fail with exactly `want`. */
static void expect_errno(const char *what, long nr, long a0, long a1, long a2, long a3,
			 long a4, long a5, int want)
{
	errno = 0;
	long r = syscall(nr, a0, a1, a2, a3, a4, a5);
	int e = r == -1 ? errno : 0;
	if (r == 0 && (nr == SYS_clone || nr == SYS_clone3 || nr == SYS_fork || nr == SYS_vfork))
		_exit(0); /* child of a clone that should not have happened */
	if (nr == SYS_clone || nr == SYS_clone3)
		reap(r);
	char w[32];
	snprintf(w, sizeof w, "%s", strerrorname_np(want) ? strerrorname_np(want) : "?");
	report(r == -1 && e == want, what, r, e, w);
}

/* Expect the filter to let the call through: success, or a kernel error
 * other than the filter's EPERM/ENOSYS (the argument checks ran). */
static void expect_through(const char *what, long r, int e)
{
	report(r >= 0 || (e != EPERM && e != ENOSYS), what, r, r < 0 ? e : 0,
	       "success or a kernel error other than EPERM/ENOSYS");
}

static int seccomp_active(void)
{
	FILE *f = fopen("/proc/self/status", "r");
	char line[256];
	int mode = -1;
	if (!f)
		return 0;
	while (fgets(line, sizeof line, f))
		if (sscanf(line, "Seccomp: %d", &mode) == 1)
			break;
	fclose(f);
	return mode == 2;
}

static void run_list(const char *path)
{
	FILE *f = fopen(path, "r");
	char name[128], what[192];
	long nr;
	int want;
	if (!f) {
		printf("FAIL cannot open list %s: %s\n", path, strerror(errno));
		failures++;
		return;
	}
	while (fscanf(f, "%ld %127s %d", &nr, name, &want) == 3) {
		/* The kernel runs uprobe/uretprobe without consulting seccomp when
		 * called from its trampoline, and kills the caller (SIGILL) on
		 * some versions when called from anywhere else. */
		if (!strcmp(name, "uprobe") || !strcmp(name, "uretprobe")) {
			printf("skip %s: not callable outside a kernel uprobe trampoline\n", name);
			continue;
		}
		snprintf(what, sizeof what, "list %s(%ld)", name, nr);
		expect_errno(what, nr, -1, -1, -1, -1, -1, -1, want);
	}
	fclose(f);
}

static void clone_rules(void)
{
	static const struct {
		long flag;
		const char *name;
	} ns[] = {
		{0x00020000, "CLONE_NEWNS"},   {0x02000000, "CLONE_NEWCGROUP"},
		{0x04000000, "CLONE_NEWUTS"},  {0x08000000, "CLONE_NEWIPC"},
		{0x10000000, "CLONE_NEWUSER"}, {0x20000000, "CLONE_NEWPID"},
		{0x40000000, "CLONE_NEWNET"},
	};
	char what[96];
	/* Allowed side: a fork-style clone. */
	errno = 0;
	long r = syscall(SYS_clone, (long)SIGCHLD, 0L, 0L, 0L, 0L);
	if (r == 0)
		_exit(0);
	int e = errno;
	reap(r);
	report(r > 0, "arg clone(SIGCHLD) allowed", r, r < 0 ? e : 0, "a child pid");
	/* fork() and vfork() use clone()/their own numbers: both allowed. */
	pid_t p = fork();
	if (p == 0)
		_exit(0);
	reap(p);
	report(p > 0, "arg fork() allowed", p, p < 0 ? errno : 0, "a child pid");
	for (size_t i = 0; i < sizeof ns / sizeof ns[0]; i++) {
		snprintf(what, sizeof what, "arg clone(%s|SIGCHLD) denied", ns[i].name);
		expect_errno(what, SYS_clone, ns[i].flag | SIGCHLD, 0, 0, 0, 0, 0, EPERM);
	}
	expect_errno("arg clone(CLONE_NEWUSER|CLONE_NEWNS|SIGCHLD) denied", SYS_clone,
		     0x10000000 | 0x00020000 | SIGCHLD, 0, 0, 0, 0, 0, EPERM);
	expect_errno("arg clone(1<<32|CLONE_NEWUSER|SIGCHLD) denied (high bits)", SYS_clone,
		     (long)(1UL << 32) | 0x10000000 | SIGCHLD, 0, 0, 0, 0, 0, EPERM);
	/* clone3 with a valid struct: ENOSYS, so libc falls back to clone. */
	uint64_t args[11] = {0};
	args[4] = SIGCHLD; /* exit_signal */
	expect_errno("arg clone3({exit_signal=SIGCHLD}) ENOSYS", SYS_clone3, (long)args,
		     (long)sizeof args, 0, 0, 0, 0, ENOSYS);
}

static void socket_rules(void)
{
	static const struct {
		int family, type;
		const char *name;
	} ok[] = {
		{AF_UNIX, SOCK_STREAM, "AF_UNIX"},   {AF_INET, SOCK_STREAM, "AF_INET"},
		{AF_INET6, SOCK_DGRAM, "AF_INET6"},  {AF_NETLINK, SOCK_RAW, "AF_NETLINK"},
		{39, SOCK_STREAM, "39 (just above AF_ALG)"},
		{41, SOCK_STREAM, "41 (just above AF_VSOCK)"},
	};
	char what[96];
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		errno = 0;
		long r = syscall(SYS_socket, (long)ok[i].family, (long)ok[i].type, 0L);
		int e = errno;
		if (r >= 0)
			close((int)r);
		snprintf(what, sizeof what, "arg socket(%s) allowed", ok[i].name);
		expect_through(what, r, e);
	}
	expect_errno("arg socket(AF_ALG) denied", SYS_socket, 38, SOCK_SEQPACKET, 0, 0, 0, 0,
		     EPERM);
	expect_errno("arg socket(AF_VSOCK) denied", SYS_socket, 40, SOCK_STREAM, 0, 0, 0, 0,
		     EPERM);
	expect_errno("arg socket(1<<32|AF_ALG) denied (high bits)", SYS_socket,
		     (long)(1UL << 32) | 38, SOCK_SEQPACKET, 0, 0, 0, 0, EPERM);
	expect_errno("arg socket(~0<<32|AF_VSOCK) denied (high bits)", SYS_socket,
		     (long)(~0UL << 32) | 40, SOCK_STREAM, 0, 0, 0, 0, EPERM);
}

static void ioctl_rules(void)
{
	int pfd[2];
	char c = 'x';
	if (pipe(pfd) != 0) {
		printf("FAIL pipe: %s\n", strerror(errno));
		failures++;
		return;
	}
	int devnull = open("/dev/null", O_RDONLY | O_CLOEXEC);
	/* Denied side, on fd 0 and on a non-tty: the filter answers first. */
	expect_errno("arg ioctl(0, TIOCSTI) denied", SYS_ioctl, 0, TIOCSTI, (long)&c, 0, 0, 0,
		     EPERM);
	expect_errno("arg ioctl(pipe, TIOCSTI) denied", SYS_ioctl, pfd[0], TIOCSTI, (long)&c, 0,
		     0, 0, EPERM);
	expect_errno("arg ioctl(0, 1<<32|TIOCSTI) denied (high bits)", SYS_ioctl, 0,
		     (long)(1UL << 32) | TIOCSTI, (long)&c, 0, 0, 0, EPERM);
	expect_errno("arg ioctl(0, ~0<<32|TIOCSTI) denied (high bits)", SYS_ioctl, 0,
		     (long)(~0UL << 32) | TIOCSTI, (long)&c, 0, 0, 0, EPERM);
	expect_errno("arg ioctl(0, TIOCLINUX) denied", SYS_ioctl, 0, TIOCLINUX, (long)&c, 0, 0, 0,
		     EPERM);
	expect_errno("arg ioctl(0, 1<<40|TIOCLINUX) denied (high bits)", SYS_ioctl, 0,
		     (long)(1UL << 40) | TIOCLINUX, (long)&c, 0, 0, 0, EPERM);
	/* Allowed side: the kernel's own answer comes back. */
	int n = -1;
	errno = 0;
	long r = syscall(SYS_ioctl, pfd[0], FIONREAD, &n);
	report(r == 0 && n == 0, "arg ioctl(pipe, FIONREAD) allowed", r, r ? errno : 0, "0");
	char tio[64];
	errno = 0;
	r = syscall(SYS_ioctl, devnull, TCGETS, tio);
	report(r == -1 && errno == ENOTTY, "arg ioctl(/dev/null, TCGETS) allowed", r,
	       r ? errno : 0, "ENOTTY");
	errno = 0;
	r = syscall(SYS_ioctl, devnull, TIOCSTI + 1, &c);
	expect_through("arg ioctl(/dev/null, TIOCSTI+1) allowed", r, errno);
	errno = 0;
	r = syscall(SYS_ioctl, devnull, TIOCLINUX - 1, &c);
	expect_through("arg ioctl(/dev/null, TIOCLINUX-1) allowed", r, errno);
	close(pfd[0]);
	close(pfd[1]);
	if (devnull >= 0)
		close(devnull);
}

static void personality_rules(void)
{
	static const unsigned long ok[] = {0xffffffffUL, PER_LINUX, PER_LINUX32, UNAME26,
					   UNAME26 | PER_LINUX32};
	char what[96];
	for (size_t i = 0; i < sizeof ok / sizeof ok[0]; i++) {
		errno = 0;
		long r = syscall(SYS_personality, ok[i]);
		snprintf(what, sizeof what, "arg personality(%#lx) allowed", ok[i]);
		report(r >= 0, what, r, r < 0 ? errno : 0, "the previous persona");
	}
	syscall(SYS_personality, (long)PER_LINUX); /* back to normal */
	static const struct {
		unsigned long v;
		const char *name;
	} bad[] = {
		{ADDR_NO_RANDOMIZE, "ADDR_NO_RANDOMIZE"},
		{MMAP_PAGE_ZERO, "MMAP_PAGE_ZERO"},
		{ADDR_COMPAT_LAYOUT, "ADDR_COMPAT_LAYOUT"},
		{READ_IMPLIES_EXEC, "READ_IMPLIES_EXEC"},
		{(1UL << 32) | ADDR_NO_RANDOMIZE, "1<<32|ADDR_NO_RANDOMIZE (high bits)"},
	};
	for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
		snprintf(what, sizeof what, "arg personality(%s) denied", bad[i].name);
		expect_errno(what, SYS_personality, (long)bad[i].v, 0, 0, 0, 0, 0, EPERM);
	}
	/* Any other value: not allowed, not a deliberate denial: the default. */
	expect_errno("arg personality(PER_BSD) default", SYS_personality, PER_BSD, 0, 0, 0, 0, 0,
		     ENOSYS);
}

/* x32 ABI numbers (bit 30 set) are not in the profile: sandboxd's filter
 * answers ENOSYS; libseccomp (runc) treats them as a foreign architecture
 * and kills the thread with SIGSYS. Both deny; checked in a child. */
static void x32_denied(void)
{
	pid_t p = fork();
	if (p == 0) {
		errno = 0;
		long r = syscall(0x40000000L | SYS_getpid);
		_exit(r == -1 && errno == ENOSYS ? 0 : 1);
	}
	int st = 0;
	waitpid(p, &st, 0);
	int ok = (WIFEXITED(st) && WEXITSTATUS(st) == 0) ||
		 (WIFSIGNALED(st) && WTERMSIG(st) == SIGSYS);
	report(ok, "nr 0x40000027 (x32 getpid) denied", st, 0,
	       WIFSIGNALED(st) ? "ENOSYS (got SIGSYS: libseccomp bad-arch kill, also a denial)"
			       : "ENOSYS");
}

/* The i386 ABI (int $0x80) is a second syscall table with its own numbers;
 * the filter only knows x86_64, so any i386 call must die: sandboxd's
 * filter and libseccomp both kill on a foreign audit arch (SIGSYS). A kernel
 * without ia32 emulation answers with SIGSEGV before seccomp: also closed. */
static void i386_denied(void)
{
	pid_t p = fork();
	if (p == 0) {
		long r;
		/* i386 getpid is 20 */
		__asm__ volatile("int $0x80" : "=a"(r) : "a"(20L) : "memory");
		_exit(r > 0 ? 3 : 4);
	}
	int st = 0;
	waitpid(p, &st, 0);
	int sig = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
	report(sig == SIGSYS || sig == SIGSEGV, "i386 int $0x80 getpid killed", st, 0,
	       sig == SIGSEGV ? "SIGSYS (got SIGSEGV: no ia32 emulation, also closed)"
			      : "SIGSYS");
}

int main(int argc, char **argv)
{
	if (!seccomp_active()) {
		printf("FAIL gate: no seccomp filter is active (Seccomp: 2 missing in "
		       "/proc/self/status); refusing to issue denied syscalls unfiltered\n");
		printf("summary: 0 checks, 1 failures\n");
		return 2;
	}
	/* No controlling terminal: vhangup() and the tty ioctls could then not
	 * touch the caller's terminal even if the filter let them through. */
	setsid();
	if (argc > 1)
		run_list(argv[1]);
	/* Unassigned numbers and numbers beyond any table: the default. */
	expect_errno("nr 400 (unassigned) ENOSYS", 400, -1, -1, -1, -1, -1, -1, ENOSYS);
	expect_errno("nr 1000 (beyond the table) ENOSYS", 1000, -1, -1, -1, -1, -1, -1, ENOSYS);
	x32_denied();
	i386_denied();
	clone_rules();
	socket_rules();
	ioctl_rules();
	personality_rules();
	/* The basics still work. */
	report(getpid() > 0, "allowed getpid()", getpid(), 0, "a pid");
	printf("summary: %d checks, %d failures\n", checks, failures);
	return failures ? 1 : 0;
}
