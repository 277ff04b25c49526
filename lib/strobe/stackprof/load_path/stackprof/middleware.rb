# frozen_string_literal: true

# `require "stackprof/middleware"` once strobe/stackprof is loaded: Strobe's
# StackProf::Middleware (see ../stackprof.rb).
require_relative "../../../stackprof"
StackProf::Middleware # rubocop:disable Lint/Void -- loads the autoload now, as the gem's file would
