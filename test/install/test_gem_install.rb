# frozen_string_literal: true

require "test_helper"
require "tmpdir"
require "fileutils"
require "rubygems/package"

# What a user gets from the published gem: strobe-profiler built from this
# checkout with `gem build`, installed with `gem install` into a gem home of
# its own, then used from another directory, as the README says: the
# `strobe` command, and `require "strobe"` through Bundler with the gem's
# name in a Gemfile. Run by `rake test:install` (.ci/run): it compiles the
# extension once more, as `gem install` does.
class TestGemInstall < Minitest::Test
  include StrobeTestHelpers

  GEMSPEC = File.join(ROOT, "strobe-profiler.gemspec")
  NAME = "strobe-profiler"
  # The only warnings `gem build` may print: the project has no homepage yet.
  ALLOWED_WARNINGS = [/\AWARNING: +no homepage specified\z/, %r{\AWARNING: +See https://guides\.rubygems\.org/}].freeze

  def setup
    @dir = Dir.mktmpdir("strobe-gem")
    @home = File.join(@dir, "gems")
    @work = File.join(@dir, "elsewhere")
    Dir.mkdir(@work)
  end

  def teardown
    FileUtils.rm_rf(@dir)
  end

  def test_build_install_run_and_bundler_require
    gem_file = build_gem
    install(gem_file)
    run_installed_command
    require_through_bundler
  end

  private

  # A user's environment: this Ruby, the new gem home, nothing of the
  # checkout (no -I, no RUBYOPT, no Bundler of an outer `bundle exec`).
  def user_env
    env = ENV.keys.grep(/\A(BUNDLE_|BUNDLER_|RUBY|GEM_)/).to_h { |key| [key, nil] }
    env.merge("GEM_HOME" => @home, "GEM_PATH" => @home,
              "PATH" => [File.join(@home, "bin"), RbConfig::CONFIG["bindir"], ENV["PATH"]].join(File::PATH_SEPARATOR))
  end

  def gem_command(*args, chdir:, timeout: 300)
    out, err, status = run_command(user_env, RbConfig.ruby, "-S", "gem", *args, chdir: chdir, timeout: timeout)
    assert status.success?, "gem #{args.join(' ')}: #{status.inspect}\n#{out}\n#{err}"
    [out, err]
  end

  def build_gem
    gem_file = File.join(@dir, "#{NAME}-#{Strobe::VERSION}.gem")
    out, err = gem_command("build", GEMSPEC, "--output", gem_file, chdir: ROOT)
    assert_match(/Name: #{NAME}$/, out)
    warnings = (out + err).lines.map(&:strip).grep(/WARNING/)
    unexpected = warnings.reject { |line| ALLOWED_WARNINGS.any? { |allowed| allowed.match?(line) } }
    assert_empty unexpected, "gem build warned"
    spec = Gem::Package.new(gem_file).spec
    assert_equal "MIT", spec.license
    assert_includes spec.files, "LICENSE"
    assert_includes spec.files, "lib/strobe-profiler.rb"
    assert_match(/Linux only/, spec.description)
    gem_file
  end

  def install(gem_file)
    gem_command("install", "--local", "--no-document", "--install-dir", @home, "--bindir", File.join(@home, "bin"),
                gem_file, chdir: @work)
    assert File.executable?(File.join(@home, "bin", "strobe")), "gem install put no strobe command in the gem home"
  end

  def run_installed_command
    File.write(File.join(@work, "script.rb"), <<~RUBY)
      def fib(n) = n < 2 ? n : fib(n - 1) + fib(n - 2)
      deadline = Process.clock_gettime(Process::CLOCK_MONOTONIC) + 0.3
      fib(20) while Process.clock_gettime(Process::CLOCK_MONOTONIC) < deadline
      puts "script done"
    RUBY
    out, err, status = run_command(user_env, "strobe", "run", "--mode", "cpu", "--", "ruby", "script.rb", chdir: @work)
    assert status.success?, "strobe run: #{status.inspect}\n#{out}\n#{err}"
    assert_equal "script done\n", out, "standard output is the program's alone"
    assert_match(/^\s+\d+ .*Object#fib$/, err, "the report, on standard error, names the script's method")
    profile = File.join(@work, "strobe-profile.json")
    assert File.exist?(profile), "strobe run wrote no profile in the current directory"
    # The installed library is what ran: its extension, not the checkout's.
    loaded, err, status = run_command(user_env, RbConfig.ruby, "-e", <<~RUBY, chdir: @work)
      require "strobe"
      result = Strobe.load("strobe-profile.json")
      puts $LOADED_FEATURES.grep(/strobe\\.so\\z/)
      puts result[:mode], result[:frames].values.any? { |frame| frame[:name] == "Object#fib" }
    RUBY
    assert status.success?, err
    so, mode, found = loaded.lines.map(&:chomp)
    assert so.start_with?(@home), "loaded #{so}, not the installed gem's extension"
    assert_equal %w[cpu true], [mode, found]
  end

  def require_through_bundler
    File.write(File.join(@work, "Gemfile"), <<~RUBY)
      source "https://rubygems.org"
      gem "#{NAME}"
    RUBY
    bundle = File.join(RbConfig::CONFIG["bindir"], "bundle")
    bundle = "bundle" unless File.exist?(bundle)
    env = user_env.merge("BUNDLE_GEMFILE" => File.join(@work, "Gemfile"))
    out, err, status = run_command(env, RbConfig.ruby, "-S", bundle, "install", "--local", chdir: @work, timeout: 180)
    assert status.success?, "bundle install --local: #{out}\n#{err}"
    out, err, status = run_command(env, RbConfig.ruby, "-S", bundle, "exec", "ruby", "-e", <<~RUBY, chdir: @work)
      Bundler.require
      result = Strobe.run(mode: :custom) { Strobe.sample }
      puts Strobe::VERSION, result[:samples]
    RUBY
    assert status.success?, "Bundler.require: #{out}\n#{err}"
    assert_equal [Strobe::VERSION, "1"], out.lines.map(&:chomp)
  end
end
