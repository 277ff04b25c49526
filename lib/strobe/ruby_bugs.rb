# frozen_string_literal: true

module Strobe
  # Bugs of particular Ruby releases that profiling can set off, told once
  # per process at start (on stderr). Version numbers decide here because
  # a bug fixed in a release is not a feature extconf.rb can detect.
  module RubyBugs
    # Ruby 4.0.0 to 4.0.4: a child forked while thread event hooks are
    # registered can deadlock (Ruby bug #21959, fixed in 4.0.5). Strobe
    # registers one (GVL states) in :wall and :cpu modes.
    FORK_WITH_THREAD_HOOKS = ([4, 0, 0]...[4, 0, 5]).freeze

    # The warning for profiling in mode on Ruby version, or nil.
    def self.warning(mode, version = RUBY_VERSION)
      release = version.split(".").first(3).map(&:to_i)
      return nil unless %i[wall cpu].include?(mode) && FORK_WITH_THREAD_HOOKS.cover?(release)

      "strobe: Ruby #{version} can hang in a process forked while profiling (#{mode}) is on: Ruby bug #21959 " \
        "(a fork while thread event hooks are registered), fixed in Ruby 4.0.5. Upgrade Ruby, or stop profiling " \
        "around fork (Puma: profile in the workers, after they boot)."
    end

    @told = false

    # Tells the warning for mode, once per process.
    def self.tell(mode, io = $stderr)
      return if @told

      message = warning(mode)
      return unless message

      @told = true
      io.puts message
    end
  end
end
