# frozen_string_literal: true

# `rake test:stress`: every scenario of scenarios.rb in a child process,
# STRESS_ROUNDS times (2 by default), each checked for its exit status, for
# no VM crash report on stderr, and for a profile that loads and reports.
require "test_helper"
require "stringio"
require "tmpdir"
require_relative "scenarios"

class TestStress < Minitest::Test
  ROUNDS = Integer(ENV.fetch("STRESS_ROUNDS", "2"))
  TIMEOUT = 120
  # STRESS_RUBY_ARGS="--zjit": every scenario under that JIT (or other
  # Ruby options); a scenario that picks its own JIT is left out then.
  RUBY_ARGS = ENV.fetch("STRESS_RUBY_ARGS", "").split
  JIT = /\A--(yjit|zjit)/

  def run_scenario(name, spec)
    ruby_args = spec.fetch(:ruby_args, [])
    if ruby_args.any?(JIT) && RUBY_ARGS.any?(JIT)
      skip "#{name} picks its own JIT (#{ruby_args.join(' ')}); STRESS_RUBY_ARGS is #{RUBY_ARGS.join(' ')}"
    end
    if (since = spec[:since_ruby]) && Gem::Version.new(RUBY_VERSION) < Gem::Version.new(since)
      skip "#{name}: #{spec.fetch(:why)}"
    end
    if (plain = spec[:unless_ruby_crashes]) && (why = ruby_crashes(plain, ruby_args))
      skip "#{name}: Ruby #{RUBY_VERSION} itself does not survive the program without Strobe (#{why})"
    end
    Dir.mktmpdir("strobe-stress") do |dir|
      out_path = File.join(dir, "#{name}.json")
      code = StressScenarios::PRELUDE + spec.fetch(:code)
      out, err, status = run_command({ "STRESS_OUT" => out_path }, RbConfig.ruby, *RUBY_ARGS, *ruby_args,
                                     "-I#{ENV['STROBE_LIB'] || LIB}", "-I#{LIB}", "-e", code, timeout: TIMEOUT)
      context = "#{name}: #{status.inspect}\nstdout: #{out[0, 500]}\nstderr: #{err[0, 2000]}"
      refute status.signaled?, "killed by a signal: #{context}"
      refute_match(/\[BUG\]|Segmentation fault|AddressSanitizer|runtime error:/, err, context)
      assert_equal spec.fetch(:status, 0), status.exitstatus, context
      assert_match spec[:stderr], err, context if spec[:stderr]
      check_profile(out_path, context) if spec.fetch(:profile, true)
    end
  end

  # Why Ruby fails on code run without Strobe (its first line on stderr),
  # or nil when it does not; once per program and Ruby options.
  def ruby_crashes(code, ruby_args)
    @@plain ||= {}
    @@plain.fetch([code, ruby_args]) do
      _, err, status = run_command({}, RbConfig.ruby, *RUBY_ARGS, *ruby_args, "-e", code, timeout: TIMEOUT)
      @@plain[[code, ruby_args]] = status.success? ? nil : err.lines.first.to_s.strip
    end
  end

  def check_profile(path, context)
    assert File.exist?(path), "no profile written: #{context}"
    result = Strobe.load(path)
    assert_operator result[:samples], :>, 0, context
    report = Strobe::Report.new(result)
    text = StringIO.new
    report.print_text(text)
    assert_match(/TOTAL +\(pct\) +SAMPLES/, text.string)
    return unless result[:raw]

    folded = StringIO.new
    report.print_stackcollapse(folded)
    assert_equal result[:samples], folded.string.lines.sum { |line| line.chomp[/\d+\z/].to_i }, context
  end

  StressScenarios::SCENARIOS.each do |name, spec|
    ROUNDS.times do |round|
      define_method("test_#{name}_round_#{round + 1}") { run_scenario(name, spec) }
    end
  end
end
