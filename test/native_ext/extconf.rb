# frozen_string_literal: true

# Builds test/native_ext for test_native.rb (see strobe_native_test.c).
require "mkmf"
$CFLAGS << " -O2 -g"
create_makefile("strobe_native_test")
