# frozen_string_literal: true

# The gem is published as strobe-profiler; Bundler.require (a Gemfile's
# `gem "strobe-profiler"`) requires the gem's name, which is Strobe.
require_relative "strobe"
