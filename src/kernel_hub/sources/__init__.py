"""Where builds come from: a local kernel folder or a Hub repo (the Hub client, its cache, kernel-builder layouts), and
the bounds every network answer is read under."""
