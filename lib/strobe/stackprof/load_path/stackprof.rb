# frozen_string_literal: true

# `require "stackprof"` once strobe/stackprof is loaded: this directory is
# then first on $LOAD_PATH, so a library that requires stackprof itself
# gets Strobe's StackProf instead of the gem (which would refuse to load
# over it).
require_relative "../../stackprof"
