/* signals.c - flag-only handlers for SIGUSR1 and SIGTERM (see signals.h). */
#define _XOPEN_SOURCE 700
#include "launcher/signals.h"

#include <signal.h>
#include <string.h>

static volatile sig_atomic_t g_pending;

static void on_signal(int sig) {
  if (!g_pending) g_pending = sig;
}

void st_signals_install(void) {
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART; /* file writes in progress resume, not fail */
  sigaction(SIGUSR1, &sa, NULL);
  sigaction(SIGTERM, &sa, NULL);
}

int st_signals_pending(void) { return g_pending; }
