# frozen_string_literal: true

require_relative "test_helper"
require_relative "pyroscope_receiver"
require "socket"
require "stringio"
require "strobe/cli"
require "strobe/continuous"
require "strobe/serve"

# No line Strobe writes holds a password or a token (issue 30, item 6):
# not autorun's lines, not the continuous profiler's warnings when the
# store fails, not the errors of a bad URL, not #inspect, not `strobe
# report URL`'s failures.
class TestRedaction < Minitest::Test
  PASSWORD = "Zq9s3cr3tPw"
  TOKEN = "Tk7b3ar3rTok"
  SECRETS = [PASSWORD, TOKEN, [PASSWORD].pack("m0"), ["user:#{PASSWORD}"].pack("m0"), "Basic", "Bearer"].freeze

  def refute_secrets(text, context)
    SECRETS.each { |secret| refute_includes text, secret, "#{context}:\n#{text}" }
  end

  def autorun(env, seconds: 1.5)
    env = { "RUBYOPT" => "-rstrobe/autorun", "STROBE_SERVICE_NAME" => "worker", "STROBE_UPLOAD_EVERY" => "1" }.merge(env)
    code = "t = Time.now; nil while Time.now - t < #{seconds}"
    _, err, status = run_ruby(code, env: env)
    assert status.success?, err
    err
  end

  # A port nothing listens on (the store is down).
  def closed_port
    server = TCPServer.new("127.0.0.1", 0)
    server.addr[1]
  ensure
    server&.close
  end

  def test_credentials_in_the_url_are_used_and_never_written
    receiver = PyroscopeReceiver.new
    url = "http://user:#{PASSWORD}@127.0.0.1:#{receiver.port}"
    err = autorun({ "STROBE_CONTINUOUS_URL" => url })
    assert_match(%r{profiling continuously to http://127\.0\.0\.1:#{receiver.port} as worker}, err)
    refute_secrets(err, "a store that takes the profiles")
    uploads = receiver.all_uploads
    refute_empty uploads
    assert_equal ["Basic #{["user:#{PASSWORD}"].pack('m0')}"], uploads.map { |u| u.headers["authorization"] }.uniq,
                 "the URL's user and password authenticate the uploads"

    { error: /HTTP 500 store unavailable/, unauthorized: /HTTP 401 Unauthorized/ }.each do |behaviour, said|
      receiver.behaviour = behaviour
      err = autorun({ "STROBE_CONTINUOUS_URL" => url })
      assert_match(/could not upload a profile: #{said.source}/, err)
      refute_secrets(err, "a store that answers #{behaviour}")
      err = autorun({ "STROBE_CONTINUOUS_URL" => receiver.url, "STROBE_BEARER_TOKEN" => TOKEN })
      assert_match(/could not upload a profile: #{said.source}/, err)
      refute_secrets(err, "a store that answers #{behaviour}, with a bearer token")
    end

    down = "http://user:#{PASSWORD}@127.0.0.1:#{closed_port}/pyroscope?tenant=#{TOKEN}"
    err = autorun({ "STROBE_CONTINUOUS_URL" => down })
    assert_match(/could not upload a profile: Connection refused/, err)
    refute_secrets(err, "a store that is down")
  ensure
    receiver&.stop
  end

  def test_a_url_that_is_refused_is_written_without_its_credentials
    ["ftp://user:#{PASSWORD}@host", "http://user:pw #{PASSWORD}@127.0.0.1:9", "http://u:#{PASSWORD}@host:port",
     "http://u:#{PASSWORD}@", "user:#{PASSWORD}@host:4040", "http://u:pw/#{PASSWORD}@host/"].each do |url|
      err = autorun({ "STROBE_CONTINUOUS_URL" => url }, seconds: 0)
      assert_match(/\Astrobe: not profiling: url/, err, url)
      assert_equal 1, err.lines.size, err
      refute_secrets(err, url)
    end
  end

  # Options given in Ruby: never in a message, nor in #inspect of what
  # holds them.
  def test_tokens_are_in_no_inspect_and_no_error
    receiver = PyroscopeReceiver.new(:unauthorized)
    err = StringIO.new
    url = "http://user:#{PASSWORD}@127.0.0.1:#{receiver.port}/?key=#{TOKEN}"
    session = Strobe::Continuous.start(url: url, service_name: "s", upload_every: 1, err: err)
    refute_secrets(session.inspect, "a session's inspect")
    refute_secrets(session.config.inspect, "its config's inspect")
    assert_includes session.config.inspect, "127.0.0.1:#{receiver.port}"
    wait_until(30, -> { "no upload failed: #{err.string}" }) do
      spin(0.05)
      err.string.include?("HTTP 401")
    end
    session.stop
    refute_secrets(err.string, "its warnings")

    session = Strobe::Continuous.start(url: receiver.url, service_name: "s", bearer_token: TOKEN, err: err)
    refute_secrets(session.inspect, "a session with a bearer token")
    session.stop
    session = Strobe::Continuous.start(url: receiver.url, service_name: "s", basic_auth: ["user", PASSWORD], err: err)
    refute_secrets(session.inspect, "a session with basic_auth")
    session.stop
    refute_secrets(err.string, "their warnings")

    [{ bearer_token: "#{TOKEN}\n" }, { basic_auth: ["user", PASSWORD], bearer_token: TOKEN }, { basic_auth: [PASSWORD] },
     { url: "http://u:#{PASSWORD}@h:x" }, { url: "gopher://#{TOKEN}@h" }].each do |bad|
      error = assert_raises(ArgumentError) { Strobe::Continuous::Config.new({ url: receiver.url, service_name: "s" }.merge(bad)) }
      refute_secrets(error.message, bad.keys.join(", "))
    end

    pull = Strobe::Continuous::PullServer.new("127.0.0.1:0", profiler: Strobe::Continuous::PullProfiler.new(mode: :cpu),
                                                             token: TOKEN)
    refute_secrets(pull.inspect, "a pull listener's inspect")
    serve = Strobe::Serve.new(0)
    refute_includes serve.inspect, serve.token
  ensure
    pull&.stop
    serve&.stop
    receiver&.stop
  end

  # A store (or a proxy before it) whose error quotes the Authorization
  # header it got: a refusal is told by its status only, any other error
  # with the credentials as ***, on stderr and in stats[:last_error].
  def test_an_answer_that_quotes_the_credentials_is_told_without_them
    receiver = PyroscopeReceiver.new
    # (echo: under "message" as Go's encoder writes it, percent-encoded,
    # or under another key, where the whole answer is told)
    [[:unauthorized, true, "HTTP 401 Unauthorized"], [:error, true, "HTTP 500 store unavailable: ***"],
     [:error, :percent, "HTTP 500 store unavailable: ***"],
     [:error, :elsewhere, 'HTTP 500 {"code":"internal","error":"store unavailable: ***"}']]
      .each do |behaviour, echo, told|
      receiver.behaviour = behaviour
      receiver.echo = echo
      [{ bearer_token: TOKEN }, { bearer_token: "#{TOKEN}&<x>" }, { basic_auth: ["user", PASSWORD] },
       { url: "http://user:#{PASSWORD}@127.0.0.1:#{receiver.port}" }]
        .each do |auth|
        err = StringIO.new
        Strobe::Continuous.start(**{ url: receiver.url, service_name: "s", upload_every: 1, err: err }.merge(auth))
        last_error = nil
        wait_until(30, -> { "no upload failed: #{err.string}" }) do
          spin(0.05)
          (last_error = Strobe::Continuous.stats[:last_error]) && err.string.include?("could not upload")
        end
        Strobe::Continuous.stop
        context = "a store that answers #{behaviour} quoting #{auth.keys.first}"
        assert_equal told, last_error, context
        assert_includes err.string, "could not upload a profile: #{told}", context
        refute_secrets(last_error, context)
        refute_secrets(err.string, context)
      end
    end
  ensure
    Strobe::Continuous.stop
    receiver&.stop
  end

  # `strobe report URL`: a download that fails names the URL without its
  # user, password or query.
  def test_a_failed_download_names_no_secret
    receiver = PyroscopeReceiver.new(:unauthorized)
    ["http://u:#{PASSWORD}@127.0.0.1:#{receiver.port}/p.json?token=#{TOKEN}",
     "http://u:#{PASSWORD}@127.0.0.1:#{closed_port}/p.json",
     "http://u:#{PASSWORD}@127.0.0.1:#{receiver.port}/p q.json"].each do |url|
      out, err, status = run_ruby("require 'strobe/cli'; exit Strobe::CLI.new(ARGV).run", args: ["report", url])
      assert_equal [1, ""], [status.exitstatus, out], err
      assert_match(%r{\Astrobe: cannot download http://\*\*\*@127\.0\.0\.1:\d+/p}, err)
      refute_secrets(err, url)
    end
  ensure
    receiver&.stop
  end
end
