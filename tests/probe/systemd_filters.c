/*
 * systemd_filters: installs the seccomp filters that systemd's
 * RestrictRealtime=yes installs in a service, by calling systemd's own code
 * (seccomp_restrict_realtime_full() in libsystemd-shared, what the service
 * manager runs in the service's child before exec), then execs a command.
 *
 *   systemd_filters LIBSYSTEMD_SHARED CMD ARGS...
 *
 * Used by tests/it/systemd_seccomp.rs to measure Seccomp_filters under the
 * shipped unit without systemd as PID 1.
 */
#include <dlfcn.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

int main(int argc, char **argv)
{
	if (argc < 3) {
		fprintf(stderr, "usage: %s LIBSYSTEMD_SHARED CMD ARGS...\n", argv[0]);
		return 2;
	}
	void *lib = dlopen(argv[1], RTLD_NOW);
	if (!lib) {
		fprintf(stderr, "dlopen: %s\n", dlerror());
		return 2;
	}
	int (*restrict_realtime)(int) = (int (*)(int))dlsym(lib, "seccomp_restrict_realtime_full");
	if (!restrict_realtime) {
		fprintf(stderr, "dlsym: %s\n", dlerror());
		return 2;
	}
	int r = restrict_realtime(EPERM);
	if (r < 0) {
		fprintf(stderr, "seccomp_restrict_realtime_full: %d\n", r);
		return 2;
	}
	execvp(argv[2], argv + 2);
	perror("execvp");
	return 2;
}
