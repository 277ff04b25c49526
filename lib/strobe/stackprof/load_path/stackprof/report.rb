# frozen_string_literal: true

# `require "stackprof/report"` once strobe/stackprof is loaded: Strobe's
# StackProf::Report (see ../stackprof.rb).
require_relative "../../../stackprof"
StackProf::Report # rubocop:disable Lint/Void -- loads the autoload now, as the gem's file would
